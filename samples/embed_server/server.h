/* embed_server's parts (see main.c for what the server does): the options
 * (options.c), the queue and the batcher (batch.c), HTTP and metrics
 * (http.c), warm-up and lifecycle (main.c). */
#ifndef EMBED_SERVER_H
#define EMBED_SERVER_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>

#include <jansson.h>
#include <microhttpd.h>

#include "samples/bert/bert.h"
#include "samples/bert/wordpiece.h"

/* -- Options ------------------------------------------------------------------ */

#define MAX_DEVICES 8

typedef struct options {
    const char *model, *host, *port_file, *name, *warmup_shapes;
    int port, threads, batchers, max_batch_tokens, max_batch_wait_ms, max_inputs, queue_depth, max_tokens;
    int drain_s; /* SIGTERM: how long requests in flight may take */
    int max_batch, warmup, connections, packed;
    int devices[MAX_DEVICES], n_devices; /* --devices: one runtime per GPU; 0: the default backend */
    size_t max_body;
    sj_dtype dtype;
} options;

void usage(FILE *f);
/* Parse argv into o (defaults first); 0, or nonzero after printing why. */
int parse_options(int argc, char **argv, options *o);

/* -- Metrics ------------------------------------------------------------------ */

#define N_LAT 13
extern const double LAT_BOUNDS[N_LAT];
#define N_BATCH 9
extern const int BATCH_BOUNDS[N_BATCH];
#define N_CODES 8
extern const int CODES[N_CODES];

typedef struct metrics {
    pthread_mutex_t lock;
    uint64_t requests[N_CODES];
    uint64_t lat_bucket[N_LAT + 1];
    double lat_sum;
    uint64_t lat_count;
    uint64_t batch_bucket[N_BATCH + 1];
    uint64_t batch_sum, batch_count;
    uint64_t tokens, padded_tokens, sentences;
} metrics;

/* -- The queue and the batcher -------------------------------------------------- */

typedef struct request request;

typedef struct item {
    request *req;
    int32_t *ids;
    int n;
    float *out; /* hidden floats in the request's buffer */
} item;

struct request {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int remaining;
    sj_status status;
    char error[256];
};

typedef struct server {
    options o;
    sj_runtime *rt;     /* rts[0] */
    bert_model *model;  /* models[0] */
    sj_runtime *rts[MAX_DEVICES];
    bert_model *models[MAX_DEVICES];
    int n_rt;           /* runtimes (one per --devices entry, else 1); batcher i runs on i % n_rt */
    wp_tokenizer *tk;
    int hidden;
    metrics m;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    item *queue; /* a ring of queue_depth items */
    int qhead, qlen;
    bool stopping;
    pthread_t *batchers;
    pthread_t warm_thread;
    double warm_start;
    _Atomic bool warm_skipped; /* the warm-up was refused: serve as ready */
    _Atomic bool warm_stop;    /* shutting down: the warm-up thread returns */
    _Atomic bool packed_warm;  /* --packed: the packed encoder's warm-up is over */
    _Atomic int in_flight;
} server;

typedef struct batcher {
    server *s;
    int index;
} batcher;

/* Whether /health says ready: the warm-up is over (or off, or refused). */
bool is_ready(server *s);
double now_s(void);
/* A batcher thread: arg is a batcher. */
void *batcher_main(void *arg);
/* Queues every item of a request, or none (false: the queue is full). */
bool enqueue(server *s, item *items, int n);

/* libmicrohttpd's request and completion callbacks (cls: the server). */
enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                           const char *version, const char *data, size_t *data_size, void **con_cls);
void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

#endif
