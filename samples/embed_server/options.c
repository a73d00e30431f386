/* embed_server's command line. */
#include "samples/embed_server/server.h"

void usage(FILE *f) {
    fprintf(f,
            "usage: embed_server --model DIR [options]\n"
            "  --model DIR             config.json, model.safetensors, vocab.txt (make model)\n"
            "  --port N                TCP port (default 8080; 0: any free port)\n"
            "  --host ADDR             IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port-file PATH        write the port listened on there once ready to accept\n"
            "  --threads N             shapejit kernel threads (default: all CPUs)\n"
            "  --batchers N            batches run at once (default 1)\n"
            "  --max-batch-tokens N    a batch's tokens at most (padded: batch x longest) (default 8192)\n"
            "  --packed 0|1            packed batches, no padding (sj_attention_varlen) (default 1)\n"
            "  --max-batch N           sentences in a batch at most (default 64)\n"
            "  --max-batch-wait-ms N   how long a batch waits to fill (default 2)\n"
            "  --max-inputs N          texts in one request at most (default 256; more: 413)\n"
            "  --max-body-bytes N      request body at most (default 1048576; more: 413)\n"
            "  --queue-depth N         sentences queued at most (default 4096; more: 429)\n"
            "  --max-tokens N          tokens per text, [CLS] and [SEP] counted (default 256,\n"
            "                          as sentence-transformers truncates all-MiniLM-L6-v2)\n"
            "  --max-connections N     connections at once (default 256)\n"
            "  --drain-seconds N       on SIGTERM/SIGINT, how long requests in flight may take to\n"
            "                          be answered before their connections are closed (default 30)\n"
            "  --dtype f32|f16|bf16    compute dtype (default f32)\n"
            "  --devices 0,1,...       CUDA devices to serve from: one runtime and model each,\n"
            "                          batches spread over them (default: the runtime's one)\n"
            "  --warmup 0|1            compile the declared shapes before /health is 200 (default 1)\n"
            "  --warmup-shapes LIST    the declared shapes, BATCHxSEQ,... (default: batches 1,4,8,16\n"
            "                          by sequences 16,32,...,--max-tokens)\n"
            "  --model-name NAME       the \"model\" field of answers (default all-MiniLM-L6-v2)\n"
            "Environment: SHAPEJIT_* (see the shapejit README), e.g. SHAPEJIT_BACKEND=cpu.\n");
}

int parse_options(int argc, char **argv, options *o) {
    *o = (options){.host = "127.0.0.1", .port = 8080, .batchers = 1, .max_batch_tokens = 8192,
                   .max_batch_wait_ms = 2, .max_inputs = 256, .max_body = 1 << 20, .queue_depth = 4096,
                   .max_tokens = 256, .max_batch = 64, .warmup = 1, .connections = 256, .drain_s = 30, .packed = 1,
                   .dtype = SJ_F32,
                   .name = "all-MiniLM-L6-v2"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = v ? strtol(v, NULL, 10) : 0;
#define INT_OPT(flag, field, lo, hi)                                                                      \
    if (!strcmp(a, flag)) {                                                                               \
        if (!v || n < (lo) || n > (hi)) {                                                                 \
            fprintf(stderr, "embed_server: %s needs an integer in [%ld, %ld]\n", flag, (long)(lo), (long)(hi)); \
            return -1;                                                                                    \
        }                                                                                                 \
        o->field = (int)n;                                                                                \
        i++;                                                                                              \
        continue;                                                                                         \
    }
        INT_OPT("--port", port, 0, 65535)
        INT_OPT("--threads", threads, 0, 1024)
        INT_OPT("--batchers", batchers, 1, 64)
        INT_OPT("--max-batch-tokens", max_batch_tokens, 512, 1 << 24)
        INT_OPT("--max-batch", max_batch, 1, 4096)
        INT_OPT("--max-batch-wait-ms", max_batch_wait_ms, 0, 10000)
        INT_OPT("--max-inputs", max_inputs, 1, 65536)
        INT_OPT("--queue-depth", queue_depth, 1, 1 << 24)
        INT_OPT("--max-tokens", max_tokens, 2, 512)
        INT_OPT("--max-connections", connections, 1, 65536)
        INT_OPT("--drain-seconds", drain_s, 0, 86400)
        INT_OPT("--warmup", warmup, 0, 1)
        INT_OPT("--packed", packed, 0, 1)
#undef INT_OPT
        if (!strcmp(a, "--max-body-bytes") && v && n >= 64) {
            o->max_body = (size_t)n;
            i++;
        } else if (!strcmp(a, "--model") && v) {
            o->model = argv[++i];
        } else if (!strcmp(a, "--host") && v) {
            o->host = argv[++i];
        } else if (!strcmp(a, "--port-file") && v) {
            o->port_file = argv[++i];
        } else if (!strcmp(a, "--devices") && v) {
            i++;
            o->n_devices = 0;
            for (const char *p = v; *p;) {
                char *end;
                long d = strtol(p, &end, 10);
                if (end == p || d < 0 || d > 1023 || o->n_devices == MAX_DEVICES || (*end && (*end != ',' || !end[1]))) {
                    fprintf(stderr, "embed_server: --devices takes up to %d device numbers, e.g. 0,1\n", MAX_DEVICES);
                    return -1;
                }
                for (int k = 0; k < o->n_devices; k++)
                    if (o->devices[k] == d) {
                        fprintf(stderr, "embed_server: --devices names device %ld twice\n", d);
                        return -1;
                    }
                o->devices[o->n_devices++] = (int)d;
                p = *end ? end + 1 : end;
            }
        } else if (!strcmp(a, "--warmup-shapes") && v) {
            o->warmup_shapes = argv[++i];
        } else if (!strcmp(a, "--model-name") && v) {
            o->name = argv[++i];
        } else if (!strcmp(a, "--dtype") && v) {
            i++;
            if (!strcmp(v, "f32")) o->dtype = SJ_F32;
            else if (!strcmp(v, "f16")) o->dtype = SJ_F16;
            else if (!strcmp(v, "bf16")) o->dtype = SJ_BF16;
            else {
                fprintf(stderr, "embed_server: --dtype f32, f16 or bf16\n");
                return -1;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "embed_server: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "embed_server: --model DIR is required\n");
        usage(stderr);
        return -1;
    }
    if (o->max_batch_tokens < o->max_tokens) o->max_batch_tokens = o->max_tokens;
    if (o->n_devices > o->batchers) o->batchers = o->n_devices; /* a batcher per device at least */
    return 0;
}
