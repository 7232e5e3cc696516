/* pi2-run serve: an OpenAI-compatible HTTP server over one model.
 *
 * libmicrohttpd runs a thread per connection; each request is read and
 * checked there (JSON, model, the prompt's length against the context)
 * and queued as a job. One worker thread runs the jobs in arrival order
 * through one session (runtime/session.h), so a prompt that shares its
 * start with the previous one reuses the KV cache. The connection's thread
 * waits for its job: a whole response, or server-sent events as the worker
 * produces them. It also watches its socket; a client that goes away
 * cancels its job (queued: never run; running: stopped at the next token).
 * The worker never touches a socket (MHD may reuse a closed one's number).
 * SIGINT and SIGTERM stop the server: queued jobs are answered 503, the
 * running one is cancelled. */
#include "runtime/cli/run.h"
#include "runtime/serve_json.h"
#include "runtime/session.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define SERVE_BODY_MAX (1u << 20) /* request bodies over 1 MiB: 413 */
#define SERVE_WAIT_MS 100         /* how often a waiting connection looks at its socket */

typedef struct job job;

typedef struct server {
    const run_opts *o;
    pi2_engine *e;
    pi2_session *s;
    const pi2_chat_template *tmpl; /* NULL: ChatML */
    char model_id[256];
    long long created;
    pthread_mutex_t mu;
    pthread_cond_t work;
    job *head, *tail; /* queued, in arrival order */
    int queued, max_queue;
    job *current; /* the job running, if any */
    bool running, stop;
    unsigned long long n_jobs;
} server;

struct job {
    job *next;
    int refs; /* the connection's and the queue's or the worker's */
    pthread_cond_t cv;
    pi2_api_req req;
    char *text; /* the prompt, formatted */
    char id[64];
    long long created;
    uint64_t seed;
    bool done, cancel, first;
    int status;        /* HTTP status of a whole response */
    char *out;         /* the body, or the events so far */
    size_t len, cap, sent;
};

/* ---------------- jobs (called with srv->mu held) ---------------- */

static void job_unref(job *j)
{
    if (--j->refs > 0)
        return;
    pthread_cond_destroy(&j->cv);
    pi2_api_req_free(&j->req);
    free(j->text);
    free(j->out);
    free(j);
}

/* Append n bytes of s to the job's output (false: out of memory). */
static bool job_put(job *j, const char *s, size_t n)
{
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 1024;
        while (cap < j->len + n + 1)
            cap *= 2;
        char *p = realloc(j->out, cap);
        if (!p)
            return false;
        j->out = p;
        j->cap = cap;
    }
    memcpy(j->out + j->len, s, n);
    j->len += n;
    j->out[j->len] = 0;
    return true;
}

/* One server-sent event holding json (freed here). */
static bool job_event(job *j, char *json)
{
    bool ok = json && job_put(j, "data: ", 6) && job_put(j, json, strlen(json)) && job_put(j, "\n\n", 2);
    free(json);
    return ok;
}

/* ---------------- the worker ---------------- */

typedef struct job_ctx {
    server *srv;
    job *j;
    struct MHD_Connection *conn; /* a stream's connection (NULL: the worker's) */
} job_ctx;

static pi2_api_reply job_reply(server *srv, const job *j)
{
    return (pi2_api_reply){.chat = j->req.chat, .id = j->id, .created = j->created, .model = srv->model_id};
}

static int job_emit(void *ctx, const char *text, size_t len)
{
    job_ctx *c = ctx;
    if (!c->j->req.stream)
        return 0;
    pi2_api_reply r = job_reply(c->srv, c->j);
    char *chunk = pi2_api_chunk(&r, c->j->first, text, len);
    pthread_mutex_lock(&c->srv->mu);
    c->j->first = false;
    bool ok = job_event(c->j, chunk);
    bool cancel = c->j->cancel || !ok;
    pthread_cond_broadcast(&c->j->cv);
    pthread_mutex_unlock(&c->srv->mu);
    return cancel ? -1 : 0;
}

static bool job_cancelled(void *ctx)
{
    job_ctx *c = ctx;
    pthread_mutex_lock(&c->srv->mu);
    bool cancel = c->j->cancel;
    pthread_mutex_unlock(&c->srv->mu);
    return cancel;
}

/* The job's end, under the lock: the whole response, or the last events. */
static void job_finish(server *srv, job *j, int rc, const pi2_err *err, const pi2_session_result *res)
{
    pi2_api_reply r = job_reply(srv, j);
    r.finish = res->finish == PI2_FINISH_LENGTH || res->finish == PI2_FINISH_CTX ? "length" : "stop";
    r.prompt_tokens = res->prompt_tokens;
    r.completion_tokens = res->completion_tokens;
    char *body = rc ? pi2_api_error(err->msg, rc == PI2_ERANGE ? "invalid_request_error" : "server_error", NULL,
                                    rc == PI2_ERANGE ? "context_length_exceeded" : NULL)
                 : j->req.stream ? pi2_api_chunk(&r, j->first, "", 0)
                                 : pi2_api_response(&r, res->text, res->len);
    j->status = rc == 0 ? 200 : rc == PI2_ERANGE || rc == PI2_EINVAL ? 400 : 500;
    if (j->req.stream) {
        job_event(j, body);
        job_put(j, "data: [DONE]\n\n", 14);
    } else {
        free(j->out);
        j->out = body;
        j->len = body ? strlen(body) : 0;
        if (!body)
            j->status = 500;
    }
}

static void job_run(server *srv, job *j)
{
    const pi2_api_req *q = &j->req;
    job_ctx c = {srv, j, NULL};
    long long max = q->max_tokens >= 0 ? q->max_tokens : q->chat ? pi2_engine_ctx(srv->e) : 16;
    pi2_session_gen g = {.so = {.temperature = (float)q->temperature, .top_k = 0, .top_p = (float)q->top_p,
                                .seed = j->seed},
                         .max_tokens = max, .stop = q->stop, .n_stop = q->n_stop,
                         .emit = job_emit, .cancel = job_cancelled, .ctx = &c};
    pi2_session_result res;
    pi2_err err = {0};
    int rc = pi2_session_complete(srv->s, j->text, &g, &res, &err);
    if (rc && rc != PI2_ERANGE && rc != PI2_EINVAL)
        fprintf(stderr, "pi2-run serve: %s: %s\n", j->id, err.msg);
    else if (rc == 0 && res.finish == PI2_FINISH_CANCEL)
        fprintf(stderr, "pi2-run serve: %s: cancelled after %d tokens (the client went away)\n", j->id,
                res.completion_tokens);
    pthread_mutex_lock(&srv->mu);
    job_finish(srv, j, rc, &err, &res);
    pthread_mutex_unlock(&srv->mu);
}

static void *worker(void *arg)
{
    server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        while (!srv->stop && !srv->head)
            pthread_cond_wait(&srv->work, &srv->mu);
        if (srv->stop)
            break;
        job *j = srv->head;
        srv->head = j->next;
        if (!srv->head)
            srv->tail = NULL;
        srv->queued--;
        if (!j->cancel) {
            srv->running = true;
            srv->current = j;
            pthread_mutex_unlock(&srv->mu);
            job_run(srv, j);
            pthread_mutex_lock(&srv->mu);
            srv->running = false;
            srv->current = NULL;
        }
        j->done = true;
        pthread_cond_broadcast(&j->cv);
        job_unref(j);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---------------- connections ---------------- */

/* What one request gathers before it is answered. */
typedef struct conn {
    char *body;
    size_t len;
    bool too_big;
    job *j; /* queued (the connection holds a reference) */
} conn;

/* The client has gone away (or the socket broke). */
static bool conn_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Wait up to SERVE_WAIT_MS for the job's cv (srv->mu held). */
static void job_wait(job *j, pthread_mutex_t *mu)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += SERVE_WAIT_MS * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, mu, &t);
}

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, char *json)
{
    static char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    struct MHD_Response *r = json ? MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE)
                                  : MHD_create_response_from_buffer(strlen(oom), oom, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(c, json ? status : 500, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *type,
                                  const char *param, const char *code)
{
    return send_body(c, status, pi2_api_error(msg, type, param, code));
}

/* Stream reader: the job's events as the worker writes them. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    job_ctx *c = cls;
    job *j = c->j;
    ssize_t n = 0;
    pthread_mutex_lock(&c->srv->mu);
    while (j->sent == j->len && !j->done && !j->cancel) {
        job_wait(j, &c->srv->mu);
        if (j->sent == j->len && !j->done && conn_gone(c->conn))
            j->cancel = true;
    }
    if (j->sent < j->len) {
        n = (ssize_t)(j->len - j->sent < max ? j->len - j->sent : max);
        memcpy(buf, j->out + j->sent, (size_t)n);
        j->sent += (size_t)n;
    } else
        n = j->done ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    pthread_mutex_unlock(&c->srv->mu);
    return n;
}

/* MHD is done with the stream (sent, or the client went away). */
static void stream_free(void *cls)
{
    job_ctx *c = cls;
    pthread_mutex_lock(&c->srv->mu);
    c->j->cancel = true;
    job_unref(c->j);
    pthread_mutex_unlock(&c->srv->mu);
    free(c);
}

/* Answer a queued job: events as they come, or the whole response once
 * done (watching the socket meanwhile). */
static enum MHD_Result answer_job(server *srv, struct MHD_Connection *c, job *j)
{
    if (j->req.stream) {
        job_ctx *jc = malloc(sizeof *jc);
        struct MHD_Response *r = NULL;
        if (jc) {
            *jc = (job_ctx){srv, j, c};
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, jc, stream_free);
        }
        if (!r) {
            free(jc);
            return send_error(c, 500, "out of memory", "server_error", NULL, NULL);
        }
        pthread_mutex_lock(&srv->mu);
        j->refs++; /* the stream's */
        pthread_mutex_unlock(&srv->mu);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    pthread_mutex_lock(&srv->mu);
    while (!j->done) {
        job_wait(j, &srv->mu);
        if (!j->done && !j->cancel && conn_gone(c))
            j->cancel = true;
    }
    char *body = j->out;
    unsigned status = (unsigned)j->status;
    j->out = NULL;
    pthread_mutex_unlock(&srv->mu);
    return send_body(c, status, body);
}

/* A checked request into a job, queued. The prompt is formatted and its
 * length checked here, on the connection's thread (the tokenizer is
 * read-only), so a prompt over the context is a 400 at once. */
static enum MHD_Result queue_request(server *srv, struct MHD_Connection *c, conn *k, bool chat)
{
    pi2_err err = {0};
    job *j = calloc(1, sizeof *j);
    if (!j)
        return send_error(c, 500, "out of memory", "server_error", NULL, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->first = true;
    k->j = j; /* freed with the connection */
    if (pi2_api_req_parse(&j->req, chat, k->body ? k->body : "", k->len, &err) != 0)
        return send_error(c, err.code == PI2_ENOMEM ? 500 : 400, err.msg, "invalid_request_error", NULL, NULL);
    if (j->req.model && strcmp(j->req.model, srv->model_id) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist; this server runs '%.200s'", j->req.model,
                 srv->model_id);
        return send_error(c, 404, msg, "invalid_request_error", "model", "model_not_found");
    }
    int rc = chat ? pi2_chat_format(srv->tmpl, j->req.msgs, j->req.n_msgs, true, &j->text, &err)
                  : ((j->text = pi2_strdup(j->req.prompt)) ? 0 : pi2_err_set(&err, PI2_ENOMEM, "out of memory"));
    int32_t *ids = NULL;
    size_t n = 0;
    if (rc == 0 && (rc = pi2_session_encode(srv->e, j->text, &ids, &n, &err)) == 0 && n >= (size_t)pi2_engine_ctx(srv->e))
        rc = pi2_err_set(&err, PI2_ERANGE, "the prompt (%zu tokens) leaves no room for a reply in the context of %d positions",
                         n, pi2_engine_ctx(srv->e));
    free(ids);
    if (rc)
        return send_error(c, rc == PI2_ENOMEM ? 500 : 400, err.msg, "invalid_request_error", chat ? "messages" : "prompt",
                          rc == PI2_ERANGE ? "context_length_exceeded" : NULL);
    pthread_mutex_lock(&srv->mu);
    bool full = srv->queued >= srv->max_queue, stopping = srv->stop;
    if (!full && !stopping) {
        j->seed = j->req.has_seed ? j->req.seed : (uint64_t)time(NULL) * 1000003u + srv->n_jobs;
        snprintf(j->id, sizeof j->id, "%s-%llx%llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)srv->created,
                 ++srv->n_jobs);
        j->created = (long long)time(NULL);
        j->refs++; /* the queue's */
        if (srv->tail)
            srv->tail->next = j;
        else
            srv->head = j;
        srv->tail = j;
        srv->queued++;
        pthread_cond_signal(&srv->work);
    }
    pthread_mutex_unlock(&srv->mu);
    if (full || stopping)
        return send_error(c, 503, stopping ? "the server is stopping" : "too many requests are waiting; try again later",
                          "server_error", NULL, NULL);
    return answer_job(srv, c, j);
}

/* The bearer token, when the server has one: compared in constant time. */
static bool authorized(server *srv, struct MHD_Connection *c)
{
    if (!srv->o->api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    const char *key = srv->o->api_key;
    size_t hl = strlen(h), kl = strlen(key);
    unsigned char d = hl != kl;
    for (size_t i = 0; i < kl; i++)
        d |= (unsigned char)(key[i] ^ (i < hl ? h[i] : 0));
    return d == 0;
}

/* A whole request (the body read): route it. */
static enum MHD_Result route(server *srv, struct MHD_Connection *c, const char *url, const char *method, conn *k)
{
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/health") == 0) {
        if (!get)
            return send_error(c, 405, "use GET", "invalid_request_error", NULL, NULL);
        pthread_mutex_lock(&srv->mu);
        int q = srv->queued, r = srv->running;
        pthread_mutex_unlock(&srv->mu);
        return send_body(c, 200, pi2_api_health(q, r));
    }
    bool models = strcmp(url, "/v1/models") == 0, chat = strcmp(url, "/v1/chat/completions") == 0,
         cmpl = strcmp(url, "/v1/completions") == 0;
    if (!models && !chat && !cmpl)
        return send_error(c, 404, "no such endpoint", "invalid_request_error", NULL, "not_found");
    if (!authorized(srv, c))
        return send_error(c, 401, "a valid API key is required: Authorization: Bearer KEY", "invalid_request_error",
                          NULL, "invalid_api_key");
    if (models)
        return get ? send_body(c, 200, pi2_api_models(srv->model_id, srv->created))
                   : send_error(c, 405, "use GET", "invalid_request_error", NULL, NULL);
    if (!post)
        return send_error(c, 405, "use POST", "invalid_request_error", NULL, NULL);
    if (k->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is over the limit of %u bytes", SERVE_BODY_MAX);
        return send_error(c, 413, msg, "invalid_request_error", NULL, NULL);
    }
    return queue_request(srv, c, k, chat);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *size, void **con_cls)
{
    (void)version;
    conn *k = *con_cls;
    if (!k) { /* the headers: the body (if any) follows */
        if (!(k = calloc(1, sizeof *k)))
            return MHD_NO;
        *con_cls = k;
        return MHD_YES;
    }
    if (*size > 0) {
        if (!k->too_big && k->len + *size <= SERVE_BODY_MAX) {
            char *b = realloc(k->body, k->len + *size + 1);
            if (!b)
                return MHD_NO;
            memcpy(b + k->len, data, *size);
            k->body = b;
            k->len += *size;
            b[k->len] = 0;
        } else { /* read on to the end, kept no more */
            k->too_big = true;
            free(k->body);
            k->body = NULL;
            k->len = 0;
        }
        *size = 0;
        return MHD_YES;
    }
    return route(cls, c, url, method, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc)
{
    (void)c;
    (void)tc;
    server *srv = cls;
    conn *k = *con_cls;
    if (!k)
        return;
    if (k->j) {
        pthread_mutex_lock(&srv->mu);
        k->j->cancel = k->j->cancel || !k->j->done; /* the answer was cut short */
        job_unref(k->j);
        pthread_mutex_unlock(&srv->mu);
    }
    free(k->body);
    free(k);
    *con_cls = NULL;
}

/* ---------------- the server ---------------- */

/* The listening address: IPv4 or IPv6 text. */
static int serve_addr(const run_opts *o, struct sockaddr_storage *sa, unsigned *flags, pi2_err *err)
{
    const char *host = o->host ? o->host : "127.0.0.1";
    memset(sa, 0, sizeof *sa);
    struct sockaddr_in *a4 = (struct sockaddr_in *)sa;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)sa;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        *flags |= MHD_USE_IPv6;
        return 0;
    }
    return pi2_err_set(err, PI2_EINVAL, "--host '%s': give an IPv4 or IPv6 address, e.g. 127.0.0.1", host);
}

/* The model's name for the API: MODEL.pi2's file name without .pi2. */
static void model_name(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 4 && strcmp(b + n - 4, ".pi2") == 0)
        n -= 4;
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), b);
}

/* Until SIGINT or SIGTERM (blocked in every thread, taken here). */
static void serve_until_signal(server *srv, const sigset_t *sigs)
{
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "pi2-run serve: %s: stopping\n", sig == SIGINT ? "interrupt" : "terminate");
    pthread_mutex_lock(&srv->mu);
    srv->stop = true;
    if (srv->current)
        srv->current->cancel = true;
    for (job *j = srv->head, *next; j; j = next) { /* answer what waits */
        next = j->next;
        free(j->out);
        j->out = pi2_api_error("the server is stopping", "server_error", NULL, NULL);
        j->len = j->out ? strlen(j->out) : 0;
        j->status = 503;
        if (j->req.stream && j->out) {
            char *e = j->out;
            j->out = NULL;
            j->len = 0;
            job_event(j, e);
        }
        j->done = true;
        pthread_cond_broadcast(&j->cv);
        job_unref(j);
    }
    srv->head = srv->tail = NULL;
    srv->queued = 0;
    pthread_cond_broadcast(&srv->work);
    pthread_mutex_unlock(&srv->mu);
}

static int serve(server *srv, pi2_err *err)
{
    struct sockaddr_storage sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    int rc = serve_addr(srv->o, &sa, &flags, err);
    if (rc)
        return rc;
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old); /* the threads below inherit it */
    signal(SIGPIPE, SIG_IGN);
    pthread_t w;
    if (pthread_create(&w, NULL, worker, srv) != 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return pi2_err_set(err, PI2_ENOMEM, "cannot start the worker thread");
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)srv->o->port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (!d) {
        rc = pi2_err_errno(err, PI2_EIO, errno, "cannot listen on %s port %d", srv->o->host ? srv->o->host : "127.0.0.1",
                           srv->o->port);
        pthread_mutex_lock(&srv->mu);
        srv->stop = true;
        pthread_cond_broadcast(&srv->work);
        pthread_mutex_unlock(&srv->mu);
    } else {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr, "pi2-run serve: %s, %d positions of context, on http://%s:%u/v1 (stop: Ctrl-C)\n",
                srv->model_id, pi2_engine_ctx(srv->e), srv->o->host ? srv->o->host : "127.0.0.1",
                di ? di->port : (unsigned)srv->o->port);
        serve_until_signal(srv, &sigs);
    }
    pthread_join(w, NULL);
    if (d)
        MHD_stop_daemon(d); /* waits for the connections, which the stop flag ended */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int run_serve(const run_opts *o)
{
    pi2_err err = {0};
    server srv = {.o = o, .max_queue = o->max_queue > 0 ? o->max_queue : 16, .created = (long long)time(NULL)};
    pi2_chat_template t;
    pi2_chat_config cc = {0};
    int rc, status = 1;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.work, NULL);
    model_name(o->model, srv.model_id, sizeof srv.model_id);
    if ((rc = open_engine(o, o->ctx, &srv.e, &err)) != 0)
        goto out;
    run_chat_ctx(o, srv.e);
    if ((rc = run_chat_template(o, srv.e, &t, &cc, &srv.tmpl, &err)) != 0)
        goto out;
    if ((rc = pi2_session_create(&srv.s, srv.e, &err)) != 0)
        goto out;
    pi2_session_set_template(srv.s, srv.tmpl);
    if ((rc = serve(&srv, &err)) != 0)
        goto out;
    status = 0;
out:
    if (rc)
        fail(&err);
    pi2_jinja_config_free(&cc);
    pi2_session_free(srv.s);
    pi2_engine_close(srv.e);
    pthread_cond_destroy(&srv.work);
    pthread_mutex_destroy(&srv.mu);
    return status;
}
