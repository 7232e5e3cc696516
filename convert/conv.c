/* pi2-convert: what the stages tell the user. Report lines go to the
 * report stream (stdout) whole and flushed; stage lines and the progress
 * line go to stderr, the progress line only on a terminal and cleared
 * before any other line. */
#include "convert/conv.h"

#include <stdarg.h>

void conv_progress(pi2_conv *c, const char *what)
{
    if (!c->tty)
        return;
    double now = pi2_now();
    if (now - c->last_progress < 0.25)
        return;
    c->last_progress = now;
    c->progress_shown = true;
    double el = now - c->t0;
    fprintf(stderr, "\r  %s %5.1f%%  %.2f / %.2f GB read  %.0f MB/s   ", what,
            c->bytes_total ? 100.0 * c->bytes_read / c->bytes_total : 0.0, c->bytes_read / 1e9,
            c->bytes_total / 1e9, el > 0 ? c->bytes_read / el / 1e6 : 0.0);
}

void conv_stage_progress(pi2_conv *c, const char *what, int done, int total)
{
    if (!c->tty)
        return;
    double now = pi2_now();
    if (now - c->last_progress < 0.25 && done < total)
        return;
    c->last_progress = now;
    c->progress_shown = true;
    fprintf(stderr, "\r  %s %d/%d   %*s", what, done, total, 20, "");
}

void conv_progress_done(pi2_conv *c)
{
    if (c->tty && c->progress_shown)
        fprintf(stderr, "\r%*s\r", 72, "");
    c->progress_shown = false;
}

void conv_report(pi2_conv *c, const char *fmt, ...)
{
    if (!c->report)
        return;
    conv_progress_done(c);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->report, fmt, ap);
    va_end(ap);
    fflush(c->report);
}

void conv_stage(pi2_conv *c, const char *fmt, ...)
{
    if (c->o->quiet)
        return;
    conv_progress_done(c);
    if (c->report)
        fflush(c->report);
    fprintf(stderr, "pi2-convert: [%.0f s] ", pi2_now() - c->t0);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
