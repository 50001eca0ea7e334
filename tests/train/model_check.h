/* What the model tests (test_model.c for the softmax and the MLP and what all
 * three models share, test_cnn.c for the CNN) have in common: a fixed random
 * generator and batch, checked accessors to a model, the result of a gradient
 * check and the gradients it is run on, the CNN's geometry, and the learning
 * test on ten Gaussian blobs.
 *
 * bench/CMakeLists.txt builds each tests/train/test_*.c as its own executable
 * linking only terse_train, so these helpers live here as static inline
 * functions (no warning where one goes unused) rather than in a .c of their
 * own. Every failure is a criterion assertion in the calling test. */
#ifndef TERSE_TESTS_TRAIN_MODEL_CHECK_H
#define TERSE_TESTS_TRAIN_MODEL_CHECK_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

/* ---- a fixed generator, so every run sees the same data */

typedef struct {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static inline double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

static inline size_t rng_below(rng *r, size_t n) {
    return (size_t)(rng_uniform(r) * (double)n);
}

/* Irwin-Hall of 12 uniforms: close enough to a standard normal for blobs. */
static inline double rng_normal(rng *r) {
    double s = 0.0;
    for (int i = 0; i < 12; i++) s += rng_uniform(r);
    return s - 6.0;
}

/* b inputs uniform in [0, 1] with uniform labels. */
static inline void random_batch(float *x, uint8_t *y, size_t b, uint64_t seed) {
    rng r = {seed};
    for (size_t i = 0; i < b * MODEL_INPUTS; i++) x[i] = (float)rng_uniform(&r);
    for (size_t i = 0; i < b; i++) y[i] = (uint8_t)rng_below(&r, MODEL_CLASSES);
}

static inline model *create_ok(model_kind kind, size_t max_batch, uint64_t seed) {
    model *m = model_create(kind, max_batch, seed);
    cr_assert_not_null(m, "model_create(%s, %zu) failed", model_kind_name(kind), max_batch);
    return m;
}

static inline model_tensor *tensor(model *m, size_t i) {
    model_tensor *t = model_tensor_at(m, i);
    cr_assert_not_null(t);
    return t;
}

/* Tensor t is called name, is rows x cols with n their product, and its value
 * and grad are 64-byte aligned. */
static inline void expect_tensor_shape(const model_tensor *t, const char *name, size_t rows,
                                       size_t cols) {
    cr_expect_str_eq(t->name, name);
    cr_expect(t->rows == rows && t->cols == cols && t->n == t->rows * t->cols,
              "%s is %zu x %zu (n %zu)", t->name, t->rows, t->cols, t->n);
    cr_expect_eq((uintptr_t)t->value % 64, 0);
    cr_expect_eq((uintptr_t)t->grad % 64, 0);
}

/* ---- the gradient check's result and its inputs */

#define GC_BATCH 8
#define GC_SAMPLES 40 /* random coordinates per weight matrix; biases are checked whole */

typedef struct {
    size_t checked, skipped, failed;
    double worst;           /* largest relative error among the checked */
    size_t worst_tensor, worst_index;
} check_result;

static inline double rel_error(double a, double n) {
    return fabs(a - n) / fmax(fabs(a) + fabs(n), 1e-4);
}

/* A check visits every coordinate of a bias (a tensor of one column) and
 * GC_SAMPLES of a weight, drawn from r: gc_coordinates says how many,
 * gc_coordinate which the s-th is (drawing from r for a weight). */
static inline size_t gc_coordinates(const model_tensor *t) {
    return t->cols == 1 ? t->n : GC_SAMPLES;
}

static inline size_t gc_coordinate(const model_tensor *t, size_t s, rng *r) {
    return t->cols == 1 ? s : rng_below(r, t->n);
}

/* Count coordinate idx of tensor ti as checked, its analytic derivative a
 * against the numeric n: failed if their relative error is above tol, and
 * kept, with where it was, if the worst so far. */
static inline void gc_record(check_result *res, double a, double n, double tol, size_t ti,
                             size_t idx) {
    double e = rel_error(a, n);
    res->checked++;
    if (e > tol) res->failed++;
    if (e > res->worst) {
        res->worst = e;
        res->worst_tensor = ti;
        res->worst_index = idx;
    }
}

/* A model, a random batch and a copy of its analytic gradients on it. */
typedef struct {
    model *m;
    size_t b; /* images used, at most GC_BATCH */
    float x[GC_BATCH * MODEL_INPUTS];
    uint8_t y[GC_BATCH];
    float *grads[MODEL_MAX_TENSORS];
    double loss;
} gc_setup;

/* Model kind from seed 42 on b (at most GC_BATCH) images of random_batch seed
 * 7, one forward and backward, the grads copied; gc_release frees them. */
static inline void gc_prepare(gc_setup *g, model_kind kind, size_t b) {
    g->m = create_ok(kind, b, 42);
    g->b = b;
    random_batch(g->x, g->y, b, 7);
    g->loss = model_forward_backward(g->m, g->x, g->y, b);
    cr_assert(isfinite(g->loss));
    for (size_t i = 0; i < model_tensor_count(g->m); i++) {
        model_tensor *t = tensor(g->m, i);
        g->grads[i] = malloc(t->n * sizeof(float));
        cr_assert_not_null(g->grads[i]);
        memcpy(g->grads[i], t->grad, t->n * sizeof(float));
    }
}

static inline void gc_release(gc_setup *g) {
    for (size_t i = 0; i < model_tensor_count(g->m); i++) free(g->grads[i]);
    model_free(g->m);
}

/* ---- the CNN's geometry, as train.h gives it */
#define CNN_C1 16
#define CNN_POOL1 (CNN_C1 * 12 * 12) /* conv1's pooled outputs per image */
#define CNN_FEAT 512                 /* conv2's, flattened */
#define CNN_FC 128
#define CNN_PAT (CNN_POOL1 + CNN_FEAT + CNN_FC) /* pattern bytes per image */

/* ---- learning: SGD on ten Gaussian blobs */

#define BLOB_TRAIN 2048
#define BLOB_TEST 512
#define BLOB_BATCH 64

/* Ten Gaussian blobs: class c has a random centre in [0, 1]^784; a sample is
 * its centre plus N(0, 0.3^2) noise per pixel, clamped to [0, 1] as pixels are. */
static inline void make_blobs(const float *centres, float *x, uint8_t *y, size_t n, rng *r) {
    for (size_t i = 0; i < n; i++) {
        size_t c = rng_below(r, MODEL_CLASSES);
        y[i] = (uint8_t)c;
        for (size_t k = 0; k < MODEL_INPUTS; k++) {
            double v = centres[c * MODEL_INPUTS + k] + 0.3 * rng_normal(r);
            x[i * MODEL_INPUTS + k] = (float)fmin(fmax(v, 0.0), 1.0);
        }
    }
}

static inline double mean_loss(model *m, const float *x, const uint8_t *y, size_t n,
                               size_t *correct) {
    double total = 0.0;
    size_t right = 0;
    for (size_t i = 0; i < n; i += BLOB_BATCH) {
        size_t got = 0;
        total += model_evaluate(m, x + i * MODEL_INPUTS, y + i, BLOB_BATCH, &got) * BLOB_BATCH;
        right += got;
    }
    if (correct) *correct = right;
    return total / (double)n;
}

/* Plain SGD at rate lr for steps batches of BLOB_BATCH from model seed 3 must
 * at least halve the training loss and classify over 90% of held-out blobs. */
static inline void check_learns(model_kind kind, size_t steps, float lr) {
    static float centres[MODEL_CLASSES * MODEL_INPUTS];
    static float xtrain[BLOB_TRAIN * MODEL_INPUTS], xtest[BLOB_TEST * MODEL_INPUTS];
    static uint8_t ytrain[BLOB_TRAIN], ytest[BLOB_TEST];
    rng r = {314};
    for (size_t i = 0; i < MODEL_CLASSES * MODEL_INPUTS; i++) centres[i] = (float)rng_uniform(&r);
    make_blobs(centres, xtrain, ytrain, BLOB_TRAIN, &r);
    make_blobs(centres, xtest, ytest, BLOB_TEST, &r);

    model *m = create_ok(kind, BLOB_BATCH, 3);
    double start = mean_loss(m, xtrain, ytrain, BLOB_TRAIN, NULL);
    for (size_t step = 0; step < steps; step++) {
        size_t at = (step * BLOB_BATCH) % BLOB_TRAIN;
        double l = model_forward_backward(m, xtrain + at * MODEL_INPUTS, ytrain + at, BLOB_BATCH);
        cr_assert(isfinite(l), "%s: step %zu loss %g", model_kind_name(kind), step, l);
        for (size_t i = 0; i < model_tensor_count(m); i++) {
            model_tensor *t = tensor(m, i);
            for (size_t k = 0; k < t->n; k++) t->value[k] -= lr * t->grad[k];
        }
    }
    double end = mean_loss(m, xtrain, ytrain, BLOB_TRAIN, NULL);
    size_t correct = 0;
    mean_loss(m, xtest, ytest, BLOB_TEST, &correct);
    double acc = 100.0 * (double)correct / BLOB_TEST;
    cr_log_info("%s: training loss %.4f -> %.4f, held-out accuracy %.1f%%", model_kind_name(kind),
                start, end, acc);
    cr_expect(end < start / 2, "%s: loss %.4f -> %.4f", model_kind_name(kind), start, end);
    cr_expect(acc > 90.0, "%s: accuracy %.1f%%", model_kind_name(kind), acc);
    model_free(m);
}

#endif /* TERSE_TESTS_TRAIN_MODEL_CHECK_H */
