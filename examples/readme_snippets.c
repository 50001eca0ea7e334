/* The README's code, as one program: every ```c block of README.md appears
 * here line for line (tests/readme_snippets.sh checks it, ignoring
 * indentation), between code that gives its variables values. Run it as
 * the README says, with 5 ranks (2 servers, 3 workers):
 *
 *     build/tools/terse-run -n 5 build/tests/readme_snippets
 *
 * It exits 0 only if every call succeeded (or, in the parameter server's
 * quorum mode, was refused as a late push, which is that mode's point). */
/* README block 1: */
#include <stdio.h>
#include <stdlib.h>
#include <terse.h>

/* Every call returns a terse_status; terse_last_error() says why. */
#define CHECK(call)                                                 \
    do {                                                            \
        terse_status s_ = (call);                                   \
        if (s_ != TERSE_OK) {                                       \
            fprintf(stderr, "%s: %s\n", #call, terse_last_error()); \
            exit(1);                                                \
        }                                                           \
    } while (0)
/* end of block 1 */

static void backward_of_the_next_layer(void) {}

int main(void) {
    const size_t rows = 64, cols = 100, n = rows * cols;
    const char *size = getenv("TERSE_SIZE");
    const int nranks = size ? atoi(size) : 1;
    float *grad = calloc(n, sizeof(float)), *sum = calloc(n, sizeof(float));
    float *init = calloc(n, sizeof(float)), *grad_in_params_out = calloc(n, sizeof(float));
    if (!grad || !sum || !init || !grad_in_params_out) return 1;
    for (size_t i = 0; i < n; i++) grad[i] = grad_in_params_out[i] = (float)(i % 7) - 3.0f;

    /* README block 2: */
    terse_codec *codec;
    CHECK(terse_codec_create("topk:ratio=0.01,ef=1", rows, cols, &codec));
    size_t cap = terse_codec_bound(codec), len;
    void *msg = malloc(cap);
    CHECK(terse_encode(codec, grad, msg, cap, &len));            /* grad: rows*cols floats */
    CHECK(terse_decode(codec, msg, len, sum, 1.0f / nranks, 1)); /* sum += decoded / nranks */
    terse_codec_free(codec);
    /* end of block 2 */
    free(msg);

    /* README block 3: */
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;      /* everything from the environment */
    terse_comm *comm;
    CHECK(terse_comm_init(&cfg, &comm));
    CHECK(terse_allreduce(comm, grad, n, NULL, TERSE_OP_AVG)); /* NULL: dense; or a codec */
    /* end of block 3 */

    /* README block 4: */
    terse_request *req;
    CHECK(terse_allreduce_start(comm, grad, n, NULL, TERSE_OP_AVG, &req));
    backward_of_the_next_layer();                         /* overlaps with the exchange */
    CHECK(terse_request_wait(req));                       /* the status of the collective */
    terse_request_free(req);
    /* end of block 4 */

    /* README block 5: */
    terse_ps_config pc = TERSE_PS_CONFIG_INIT;            /* 5 ranks: 2 servers, 3 workers */
    pc.num_servers = 2;
    pc.update = TERSE_PS_UPDATE_SGD, pc.lr = 0.1f, pc.momentum = 0.9f;
    CHECK(terse_ps_config_parse("sync:quorum=2", &pc));   /* or sync, async, ssp:2 */
    terse_ps *ps;
    CHECK(terse_ps_create(comm, &pc, &ps));               /* every rank */
    CHECK(terse_ps_declare(ps, 0, n, "qsgd:bits=4,ef=1", NULL, init)); /* every rank, in order */
    if (terse_ps_is_server(ps)) {
        CHECK(terse_ps_serve(ps));                        /* until every worker finished */
    } else {
        terse_status s = terse_ps_pushpull(ps, 0, grad_in_params_out, NULL); /* or a request */
        if (s != TERSE_ERR_STALE) CHECK(s);               /* STALE: the quorum closed the step */
        CHECK(terse_ps_clock(ps));                        /* end of the step */
        CHECK(terse_ps_finish(ps));
    }
    terse_ps_free(ps);
    terse_comm_free(comm);
    /* end of block 5 */

    free(grad), free(sum), free(init), free(grad_in_params_out);
    return 0;
}
