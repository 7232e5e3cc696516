/* The engine's checks of a container that changes under it (engine.h,
 * "Files that change"). */
#include "runtime/state.h"

/* The one line for a file that shrank while in use. */
static int shrank(const pi2_engine *e, pi2_err *err)
{
    pi2_err_clear(err);
    return pi2_err_set(err, PI2_EIO,
                       "%s: the file changed while in use (it was cut short); stop whatever rewrites it, then run again",
                       e->path);
}

int eng_step_checked(const pi2_engine *e, int rc, pi2_err *err)
{
    return pi2_ctr_changed(pi2_bundle_container(e->b)) ? shrank(e, err) : rc;
}

int pi2_engine_recheck(const pi2_engine *e, pi2_err *err)
{
    pi2_err inner = {0};
    const pi2_ctr *c = pi2_bundle_container(e->b);
    /* offloading keeps its own copy and a memory limit: the file's pages go
     * back window by window as they are hashed */
    int rc = e->ofl ? pi2_bundle_recheck(e->b, &inner) : pi2_bundle_verify(e->b, true, NULL, &inner);
    if (e->ofl) /* what the kernel read ahead past the last window too */
        pi2_ctr_drop_pages(c);
    if (pi2_ctr_changed(c))
        return shrank(e, err);
    if (rc == PI2_ESIG)
        return pi2_err_set(err, rc, "changed since verification: %s", inner.msg);
    if (rc)
        return pi2_err_set(err, rc, "%s", inner.msg);
    return 0;
}
