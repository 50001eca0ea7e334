/* terse-bench train --mode ps:... --byzantine K:ATTACK: the last K workers
 * send attacks instead of what honest workers send (their gradient, or
 * with --momentum-at local their momentum). The attacks:
 *
 *   signflip   -4 x the honest vector (the sign-flipping attack of Xie,
 *              Koyejo and Gupta's Zeno, ICML 2019: 2 of 8 at -4 outweigh
 *              the other 6, so the mean ascends)
 *   noise      Gaussian noise of variance 200 per coordinate instead of
 *              the vector (Zeno's Gaussian attack)
 *   labelflip  the honest computation on labels y -> 9 - y
 *   alie       "a little is enough" (Baruch, Baruch and Goldberg, NeurIPS
 *              2019): mean - z std of the honest vectors, coordinate-wise,
 *              z = Phi^-1((n - s) / n), s = floor(n/2 + 1) - K
 *   ipm        inner-product manipulation (Xie, Koyejo and Gupta, UAI
 *              2019): -0.1 x the mean of the honest vectors
 *
 * alie and ipm are omniscient, as in the papers: the attacker knows what
 * every honest worker sends this step. Here it computes it: in sync mode
 * every worker pulled the same parameters, and the attacker knows each
 * honest worker's shard and batch order (they derive from the seed), so
 * it runs their forward and backward passes itself (and, with local
 * momentum, keeps their momenta) -- exact in sync mode, at (W - K) times
 * the compute; in async modes it uses the parameters it pulled. The
 * attacks then travel through the run's codec like any push. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bench.h"
#include "train/train.h"
#include "train/train_worker.h"

#define NOISE_SD 14.142135623730951 /* sqrt(200) */

static const char *const names[] = {"none", "signflip", "noise", "labelflip", "alie", "ipm"};

int train_attack_parse(const char *text, int *k, train_attack *a) {
    char *end = NULL;
    long n = strtol(text, &end, 10);
    if (end == text || *end != ':' || n < 1 || n > 255) return -1;
    for (int i = 1; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(end + 1, names[i]) == 0) {
            *k = (int)n;
            *a = (train_attack)i;
            return 0;
        }
    return -1;
}

const char *train_attack_name(train_attack a) {
    return (unsigned)a < sizeof names / sizeof *names ? names[a] : "?";
}

/* Acklam's rational approximation of the standard normal quantile
 * (relative error below 1.2e-9), for ALIE's z. */
static double normal_quantile(double p) {
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                               -2.759285104469687e+02, 1.383577518672690e+02,
                               -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                               -1.556989798598866e+02, 6.680131188771972e+01,
                               -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                               -2.400758277161838e+00, -2.549732539343734e+00,
                               4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                               2.445134137142996e+00, 3.754408661907416e+00};
    if (p <= 0) return -INFINITY;
    if (p >= 1) return INFINITY;
    if (p < 0.02425) {
        double q = sqrt(-2 * log(p));
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    }
    if (p > 1 - 0.02425) return -normal_quantile(1 - p);
    double q = p - 0.5, r = q * q;
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

double train_alie_z(int workers, int byzantine) {
    int s = workers / 2 + 1 - byzantine;
    double p = (double)(workers - s) / (double)workers;
    return normal_quantile(p);
}

int train_is_byzantine(const worker *w, const train_run *cfg) {
    return cfg->attack != ATTACK_NONE && w->rank >= w->nworkers - cfg->byz_k;
}

void train_flip_labels(uint8_t *y, size_t b) {
    for (size_t j = 0; j < b; j++) y[j] = (uint8_t)(MODEL_CLASSES - 1 - y[j]);
}

struct train_attacker {
    int honest;        /* workers 0 .. honest-1 */
    size_t total;      /* parameters */
    size_t *order;     /* honest x shard_n: each honest worker's order this epoch */
    int epoch;         /* the epoch order holds (0: none yet) */
    float **mom;       /* per honest worker, local momentum only */
    double *sum, *sq;  /* per parameter */
    uint64_t noise;
    uint64_t seed;
};

train_attacker *train_attacker_create(worker *w, const train_run *cfg, model *m) {
    train_attacker *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->honest = w->nworkers - cfg->byz_k;
    a->total = model_param_count(m);
    a->seed = cfg->seed;
    a->noise = train_stream_key(cfg->seed, 0xb12a, (uint64_t)w->rank);
    int omni = cfg->attack == ATTACK_ALIE || cfg->attack == ATTACK_IPM;
    if (!omni) return a;
    a->order = malloc((size_t)a->honest * w->shard_n * sizeof *a->order);
    a->sum = malloc(a->total * sizeof *a->sum);
    a->sq = malloc(a->total * sizeof *a->sq);
    a->mom = calloc((size_t)a->honest, sizeof *a->mom);
    int bad = !a->order || !a->sum || !a->sq || !a->mom;
    for (int j = 0; !bad && cfg->local_momentum && j < a->honest; j++)
        bad = !(a->mom[j] = calloc(a->total, sizeof(float)));
    if (bad) {
        train_attacker_free(a);
        return NULL;
    }
    return a;
}

void train_attacker_free(train_attacker *a) {
    if (!a) return;
    for (int j = 0; a->mom && j < a->honest; j++) free(a->mom[j]);
    free(a->mom), free(a->order), free(a->sum), free(a->sq);
    free(a);
}

/* Honest worker j's vector this step (batch k of the epoch a->order holds), into the sums. */
static void honest_vector(worker *w, train_attacker *a, model *m, int j, long k) {
    const train_options *o = w->o;
    size_t n = w->shard_n, *order = a->order + (size_t)j * n;
    train_fill_batch(w, &w->train, order, (size_t)k * o->batch, o->batch);
    model_forward_backward(m, w->x, w->y, o->batch);
    size_t off = 0;
    for (size_t t = 0; t < model_tensor_count(m); t++) {
        const model_tensor *mt = model_tensor_at(m, t);
        for (size_t i = 0; i < mt->n; i++) {
            double v = mt->grad[i];
            if (a->mom[j]) {
                a->mom[j][off + i] = (float)o->momentum * a->mom[j][off + i] + mt->grad[i];
                v = a->mom[j][off + i];
            }
            a->sum[off + i] += v;
            a->sq[off + i] += v * v;
        }
        off += mt->n;
    }
}

/* Replace the model's gradients (what this worker pushes) by the attack.
 * They hold the honest vector on entry (labelflip: already computed on
 * flipped labels). */
void train_attack_apply(worker *w, const train_run *cfg, train_attacker *a, model *m, int e,
                        long k) {
    const train_attack kind = cfg->attack;
    size_t nt = model_tensor_count(m);
    if (kind == ATTACK_SIGNFLIP) {
        for (size_t t = 0; t < nt; t++) {
            model_tensor *mt = model_tensor_at(m, t);
            for (size_t i = 0; i < mt->n; i++) mt->grad[i] = -4.0f * mt->grad[i];
        }
    } else if (kind == ATTACK_NOISE) {
        for (size_t t = 0; t < nt; t++) {
            model_tensor *mt = model_tensor_at(m, t);
            memset(mt->grad, 0, mt->n * sizeof(float));
            train_add_gaussian(mt->grad, mt->n, NOISE_SD, &a->noise);
        }
    } else if (kind == ATTACK_ALIE || kind == ATTACK_IPM) {
        if (a->epoch != e) { /* each honest worker's shard, dealt and shuffled as it does */
            size_t n = w->shard_n;
            for (int j = 0; j < a->honest; j++) {
                size_t *order = a->order + (size_t)j * n;
                for (size_t i = 0; i < n; i++)
                    order[i] = w->perm[i * (size_t)w->nworkers + (size_t)j];
                train_shuffle(order, n, train_stream_key(a->seed, (uint64_t)e, (uint64_t)j + 1));
            }
            a->epoch = e;
        }
        memset(a->sum, 0, a->total * sizeof *a->sum);
        memset(a->sq, 0, a->total * sizeof *a->sq);
        for (int j = 0; j < a->honest; j++) honest_vector(w, a, m, j, k);
        const double h = a->honest, z = train_alie_z(w->nworkers, cfg->byz_k);
        size_t off = 0;
        for (size_t t = 0; t < nt; t++) {
            model_tensor *mt = model_tensor_at(m, t);
            for (size_t i = 0; i < mt->n; i++) {
                double mean = a->sum[off + i] / h;
                double var = a->sq[off + i] / h - mean * mean;
                mt->grad[i] = (float)(kind == ATTACK_IPM ? -0.1 * mean
                                                         : mean - z * sqrt(var > 0 ? var : 0));
            }
            off += mt->n;
        }
    }
}
