/* The models of `terse-bench train` (bench/train/model.c), the softmax and the MLP,
 * and what all three share: analytic gradients against central finite
 * differences (and a control that shows the check can fail), the loss against
 * an independent double-precision forward, determinism, nn.Linear's and
 * nn.Conv2d's initial range, that SGD learns a separable problem, and the
 * answers to bad input. The CNN's own tests are in test_cnn.c; the helpers
 * both use, in model_check.h. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_check.h"
#include "train/train.h"

/* ---- an independent reference in double: plain loops over the tensors */

/* pre (b x HIDDEN) = x W1^T + b1, the MLP's hidden pre-activations. */
static void ref_hidden(model *m, const float *x, size_t b, double *pre) {
    const model_tensor *w1 = tensor(m, 0), *b1 = tensor(m, 1);
    for (size_t i = 0; i < b; i++)
        for (size_t j = 0; j < MODEL_HIDDEN; j++) {
            double s = b1->value[j];
            for (size_t k = 0; k < MODEL_INPUTS; k++)
                s += (double)x[i * MODEL_INPUTS + k] * w1->value[j * MODEL_INPUTS + k];
            pre[i * MODEL_HIDDEN + j] = s;
        }
}

static double ref_loss(model *m, model_kind kind, const float *x, const uint8_t *y, size_t b) {
    double *pre = kind == MODEL_MLP ? malloc(b * MODEL_HIDDEN * sizeof(double)) : NULL;
    if (kind == MODEL_MLP) {
        cr_assert_not_null(pre);
        ref_hidden(m, x, b, pre);
    }
    size_t iw = kind == MODEL_MLP ? 2 : 0;
    const model_tensor *w = tensor(m, iw), *bias = tensor(m, iw + 1);
    double total = 0.0;
    for (size_t i = 0; i < b; i++) {
        double z[MODEL_CLASSES], zmax = -INFINITY, sum = 0.0;
        for (size_t c = 0; c < MODEL_CLASSES; c++) {
            double s = bias->value[c];
            if (kind == MODEL_MLP) {
                for (size_t j = 0; j < MODEL_HIDDEN; j++)
                    s += fmax(pre[i * MODEL_HIDDEN + j], 0.0) * w->value[c * MODEL_HIDDEN + j];
            } else {
                for (size_t k = 0; k < MODEL_INPUTS; k++)
                    s += (double)x[i * MODEL_INPUTS + k] * w->value[c * MODEL_INPUTS + k];
            }
            z[c] = s;
            zmax = fmax(zmax, s);
        }
        for (size_t c = 0; c < MODEL_CLASSES; c++) sum += exp(z[c] - zmax);
        total += zmax + log(sum) - z[y[i]];
    }
    free(pre);
    return total / (double)b;
}

/* ---- the gradient check */

#define GC_TOL 1e-2
/* The differences are of the model's float forward, whose rounding (~1e-8 in
 * the loss) divided by the step is the check's noise: the worst MLP error was
 * 4e-4 at eps 1e-2, 1.3e-3 at 3e-3, 3e-3 at 1e-3, 2e-2 at 3e-4. But a wider step
 * crosses more ReLU kinks (skipped below: 26% of coordinates at 1e-2, 11% at
 * 3e-3), and without the skip about 15 coordinates fail at 3e-3. */
#define GC_EPS 3e-3

/* Would moving parameter idx of tensor ti by +-eps flip some hidden unit's
 * ReLU? Then the loss has a kink inside the difference and the difference
 * measures no derivative. pre is the hidden pre-activation (b x HIDDEN); the
 * margin of 2 covers float rounding in the model's own forward. */
static int crosses_kink(const double *pre, const float *x, size_t b, size_t ti, size_t idx,
                        double eps) {
    if (ti > 1) return 0; /* w2, b2 act after the ReLU */
    size_t unit = ti == 0 ? idx / MODEL_INPUTS : idx;
    for (size_t i = 0; i < b; i++) {
        double reach = ti == 0 ? eps * x[i * MODEL_INPUTS + idx % MODEL_INPUTS] : eps;
        if (fabs(pre[i * MODEL_HIDDEN + unit]) <= 2.0 * reach) return 1;
    }
    return 0;
}

/* The central difference of the model's own loss (model_evaluate) at one
 * coordinate. The step actually taken is what the float can hold, so divide
 * by that rather than by 2 eps. */
static double numeric_grad(model *m, float *v, const float *x, const uint8_t *y, size_t b,
                           double eps) {
    float orig = *v, plus = (float)(orig + eps), minus = (float)(orig - eps);
    *v = plus;
    double lp = model_evaluate(m, x, y, b, NULL);
    *v = minus;
    double lm = model_evaluate(m, x, y, b, NULL);
    *v = orig;
    return (lp - lm) / ((double)plus - (double)minus);
}

/* Compare analytic[t] (a copy of every tensor's grad) with central differences
 * on every bias coordinate and GC_SAMPLES random coordinates of each weight. */
static check_result grad_check(model *m, model_kind kind, float *const *analytic, const float *x,
                               const uint8_t *y, size_t b, uint64_t seed) {
    check_result res = {0};
    double *pre = NULL;
    if (kind == MODEL_MLP) {
        pre = malloc(b * MODEL_HIDDEN * sizeof(double));
        cr_assert_not_null(pre);
        ref_hidden(m, x, b, pre);
    }
    rng r = {seed};
    for (size_t ti = 0; ti < model_tensor_count(m); ti++) {
        model_tensor *t = tensor(m, ti);
        for (size_t s = 0; s < gc_coordinates(t); s++) {
            size_t idx = gc_coordinate(t, s, &r);
            if (pre && crosses_kink(pre, x, b, ti, idx, GC_EPS)) {
                res.skipped++;
                continue;
            }
            double n = numeric_grad(m, &t->value[idx], x, y, b, GC_EPS);
            gc_record(&res, analytic[ti][idx], n, GC_TOL, ti, idx);
        }
    }
    free(pre);
    return res;
}

static void check_gradients(model_kind kind) {
    static gc_setup g;
    gc_prepare(&g, kind, GC_BATCH);
    double ref = ref_loss(g.m, kind, g.x, g.y, GC_BATCH);
    cr_expect(fabs(g.loss - ref) < 1e-5, "%s: loss %.9g, double reference %.9g",
              model_kind_name(kind), g.loss, ref);
    check_result res = grad_check(g.m, kind, g.grads, g.x, g.y, GC_BATCH, 99);
    cr_log_info("%s: %zu coordinates checked, %zu skipped at a ReLU kink, worst relative error "
                "%.3g (%s[%zu])",
                model_kind_name(kind), res.checked, res.skipped, res.worst,
                tensor(g.m, res.worst_tensor)->name, res.worst_index);
    cr_expect_eq(res.failed, 0, "%s: %zu of %zu coordinates off by more than %g (worst %.3g)",
                 model_kind_name(kind), res.failed, res.checked, GC_TOL, res.worst);
    cr_expect_geq(res.checked, res.skipped * 4, "too many coordinates skipped to mean much");
    gc_release(&g);
}

Test(model_gradients, softmax_matches_central_differences) { check_gradients(MODEL_SOFTMAX); }

Test(model_gradients, mlp_matches_central_differences) { check_gradients(MODEL_MLP); }

/* The same check must fail when the gradient is wrong: 10% too large on a
 * whole tensor, or one coordinate zeroed. */
static void check_control(model_kind kind) {
    static gc_setup g;
    gc_prepare(&g, kind, GC_BATCH);
    size_t last = model_tensor_count(g.m) - 1; /* the output bias: checked whole */
    size_t nw = tensor(g.m, last - 1)->n, n = tensor(g.m, last)->n, big = 0;
    for (size_t i = 0; i < nw; i++) g.grads[last - 1][i] *= 1.1f;
    check_result scaled = grad_check(g.m, kind, g.grads, g.x, g.y, GC_BATCH, 99);
    cr_expect_gt(scaled.failed, 0, "%s: a weight gradient 10%% too large passed the check",
                 model_kind_name(kind));
    for (size_t i = 0; i < nw; i++) g.grads[last - 1][i] /= 1.1f;
    for (size_t i = 1; i < n; i++)
        if (fabsf(g.grads[last][i]) > fabsf(g.grads[last][big])) big = i;
    g.grads[last][big] = 0.0f;
    check_result zeroed = grad_check(g.m, kind, g.grads, g.x, g.y, GC_BATCH, 99);
    cr_expect_eq(zeroed.failed, 1, "%s: one zeroed bias coordinate gave %zu failures",
                 model_kind_name(kind), zeroed.failed);
    gc_release(&g);
}

Test(model_gradients, check_fails_on_wrong_softmax_gradient) { check_control(MODEL_SOFTMAX); }

Test(model_gradients, check_fails_on_wrong_mlp_gradient) { check_control(MODEL_MLP); }

/* ---- structure, initialisation, determinism */

static const char *const softmax_names[] = {"w", "b"};
static const char *const mlp_names[] = {"w1", "b1", "w2", "b2"};

Test(model, tensors_have_the_documented_names_shapes_and_alignment) {
    model *m = create_ok(MODEL_MLP, 4, 1);
    static const size_t shape[4][2] = {{256, 784}, {256, 1}, {10, 256}, {10, 1}};
    cr_assert_eq(model_tensor_count(m), 4);
    size_t total = 0;
    for (size_t i = 0; i < 4; i++) {
        model_tensor *t = tensor(m, i);
        expect_tensor_shape(t, mlp_names[i], shape[i][0], shape[i][1]);
        total += t->n;
    }
    cr_expect_eq(model_param_count(m), total);
    cr_expect_eq(total, 256 * 784 + 256 + 10 * 256 + 10);
    cr_expect_null(model_tensor_at(m, 4));
    model_free(m);

    m = create_ok(MODEL_SOFTMAX, 4, 1);
    cr_assert_eq(model_tensor_count(m), 2);
    for (size_t i = 0; i < 2; i++) cr_expect_str_eq(tensor(m, i)->name, softmax_names[i]);
    cr_expect(tensor(m, 0)->rows == 10 && tensor(m, 0)->cols == 784);
    cr_expect(tensor(m, 1)->rows == 10 && tensor(m, 1)->cols == 1);
    cr_expect_eq(model_param_count(m), 7850);
    cr_expect_null(model_tensor_at(m, 2));
    model_free(m);
}

/* The fan_in nn.Linear or nn.Conv2d gives each tensor (a bias shares its layer's). */
static double fan_in_of(model_kind kind, const char *name) {
    if (kind != MODEL_CNN) return strchr(name, '2') ? MODEL_HIDDEN : MODEL_INPUTS;
    switch (name[1]) {
    case '1': return 25;        /* 1 channel x 5 x 5 */
    case '2': return 16 * 25;   /* 16 channels x 5 x 5 */
    case '3': return CNN_FEAT;
    default: return CNN_FC;
    }
}

/* nn.Linear and nn.Conv2d: U(+-1/sqrt(fan_in)), fan_in 784 for the first layer
 * (and the softmax), 256 for the second; the CNN's as fan_in_of says; and the
 * draw fills that range. */
static void check_init_range(model_kind kind) {
    model *m = create_ok(kind, 1, 2024);
    for (size_t i = 0; i < model_tensor_count(m); i++) {
        model_tensor *t = tensor(m, i);
        double fan_in = fan_in_of(kind, t->name);
        float bound = (float)(1.0 / sqrt(fan_in));
        float top = 0.0f;
        double mean = 0.0;
        for (size_t k = 0; k < t->n; k++) {
            cr_assert(fabsf(t->value[k]) <= bound, "%s[%zu] = %g outside +-%g", t->name, k,
                      (double)t->value[k], (double)bound);
            top = fmaxf(top, fabsf(t->value[k]));
            mean += t->value[k];
        }
        mean /= (double)t->n;
        /* n uniforms: the largest is within a few bound/n of the edge, the mean
         * within a few bound/sqrt(3n) of zero. */
        cr_expect(top > bound * (1.0f - 20.0f / (float)t->n), "%s: max |v| %g of %g", t->name,
                  (double)top, (double)bound);
        cr_expect(fabs(mean) < 5.0 * bound / sqrt(3.0 * (double)t->n), "%s: mean %g", t->name,
                  mean);
    }
    model_free(m);
}

Test(model, initial_values_lie_within_nn_linear_bounds) {
    check_init_range(MODEL_SOFTMAX);
    check_init_range(MODEL_MLP);
    check_init_range(MODEL_CNN);
}

static void check_determinism(model_kind kind) {
    model *a = create_ok(kind, 16, 5), *b = create_ok(kind, 16, 5), *c = create_ok(kind, 16, 6);
    for (size_t i = 0; i < model_tensor_count(a); i++) {
        model_tensor *ta = tensor(a, i), *tb = tensor(b, i), *tc = tensor(c, i);
        cr_expect(memcmp(ta->value, tb->value, ta->n * sizeof(float)) == 0,
                  "%s %s: the same seed gave different values", model_kind_name(kind), ta->name);
        cr_expect(memcmp(ta->value, tc->value, ta->n * sizeof(float)) != 0,
                  "%s %s: seeds 5 and 6 gave the same values", model_kind_name(kind), ta->name);
    }
    /* Distinct tensors of one shape must not repeat each other's draws. */
    if (kind == MODEL_MLP) {
        cr_expect(memcmp(tensor(a, 2)->value, tensor(a, 3)->value, 10 * sizeof(float)) != 0);
    }
    if (kind == MODEL_CNN) { /* k1 and c1 share a bound */
        cr_expect(memcmp(tensor(a, 0)->value, tensor(a, 1)->value, 16 * sizeof(float)) != 0);
    }

    static float x[16 * MODEL_INPUTS];
    uint8_t y[16];
    random_batch(x, y, 16, 11);
    double l1 = model_forward_backward(a, x, y, 16);
    float *saved[MODEL_MAX_TENSORS];
    for (size_t i = 0; i < model_tensor_count(a); i++) {
        model_tensor *t = tensor(a, i);
        saved[i] = malloc(t->n * sizeof(float));
        cr_assert_not_null(saved[i]);
        memcpy(saved[i], t->grad, t->n * sizeof(float));
    }
    double l2 = model_forward_backward(a, x, y, 16);
    double l3 = model_forward_backward(b, x, y, 16);
    cr_expect(memcmp(&l1, &l2, sizeof l1) == 0 && memcmp(&l1, &l3, sizeof l1) == 0,
              "%s: losses %.17g %.17g %.17g", model_kind_name(kind), l1, l2, l3);
    for (size_t i = 0; i < model_tensor_count(a); i++) {
        model_tensor *t = tensor(a, i);
        cr_expect(memcmp(saved[i], t->grad, t->n * sizeof(float)) == 0,
                  "%s %s: a second pass on the same batch changed the gradient",
                  model_kind_name(kind), t->name);
        cr_expect(memcmp(saved[i], tensor(b, i)->grad, t->n * sizeof(float)) == 0,
                  "%s %s: a twin model got a different gradient", model_kind_name(kind), t->name);
        free(saved[i]);
    }
    model_free(a);
    model_free(b);
    model_free(c);
}

Test(model, same_seed_same_bits_and_repeatable_gradients) {
    check_determinism(MODEL_SOFTMAX);
    check_determinism(MODEL_MLP);
    check_determinism(MODEL_CNN);
}

/* ---- learning */

Test(model_learning, softmax_sgd_separates_ten_blobs) { check_learns(MODEL_SOFTMAX, 200, 0.1f); }

Test(model_learning, mlp_sgd_separates_ten_blobs) { check_learns(MODEL_MLP, 200, 0.1f); }

/* ---- evaluation and bad input */

/* Logits set by hand through the biases (weights zero): arg-max, ties to the
 * lower class, and the loss of equal logits, log 10. */
Test(model, evaluate_counts_argmax_with_ties_to_the_lower_class) {
    model *m = create_ok(MODEL_SOFTMAX, 4, 1);
    memset(tensor(m, 0)->value, 0, tensor(m, 0)->n * sizeof(float));
    float *bias = tensor(m, 1)->value;
    memset(bias, 0, MODEL_CLASSES * sizeof(float));
    static float x[4 * MODEL_INPUTS];
    uint8_t y[4] = {0, 1, 2, 9};
    size_t correct = 99;
    double loss = model_evaluate(m, x, y, 4, &correct);
    cr_expect_eq(correct, 1, "all logits equal: only class 0 wins, got %zu", correct);
    cr_expect(fabs(loss - log(10.0)) < 1e-6, "loss %.9g, want log 10", loss);
    bias[3] = bias[7] = 2.0f;
    uint8_t y3[4] = {3, 3, 7, 3};
    model_evaluate(m, x, y3, 4, &correct);
    cr_expect_eq(correct, 3, "3 and 7 tie: 3 wins, got %zu correct", correct);
    model_free(m);
}

Test(model, bad_batches_give_nan_and_touch_nothing) {
    model_kind kinds[3] = {MODEL_SOFTMAX, MODEL_MLP, MODEL_CNN};
    static float x[5 * MODEL_INPUTS];
    uint8_t y[5] = {1, 2, 3, 4, 5};
    for (size_t k = 0; k < 3; k++) {
        model *m = create_ok(kinds[k], 4, 1);
        for (size_t i = 0; i < 5 * MODEL_INPUTS; i++) x[i] = (float)(i % 251) / 250.0f;
        cr_assert(isfinite(model_forward_backward(m, x, y, 4)));
        /* Every value and gradient, to compare after the refused calls. */
        size_t nt = model_tensor_count(m), total = 0;
        for (size_t i = 0; i < nt; i++) total += tensor(m, i)->n;
        float *snap = malloc(2 * total * sizeof *snap), *p = snap;
        cr_assert_not_null(snap);
        for (size_t i = 0; i < nt; i++) {
            model_tensor *ti = tensor(m, i);
            memcpy(p, ti->value, ti->n * sizeof *p);
            memcpy(p + ti->n, ti->grad, ti->n * sizeof *p);
            p += 2 * ti->n;
        }
        size_t correct = 77;
        cr_expect(isnan(model_forward_backward(m, x, y, 0)));
        cr_expect(isnan(model_forward_backward(m, x, y, 5)), "batch over max_batch");
        cr_expect(isnan(model_evaluate(m, x, y, 0, &correct)));
        cr_expect_eq(correct, 0);
        correct = 77;
        cr_expect(isnan(model_evaluate(m, x, y, 5, &correct)));
        cr_expect_eq(correct, 0);
        uint8_t bad[4] = {0, 1, 10, 2};
        cr_expect(isnan(model_forward_backward(m, x, bad, 4)), "label 10 is not a class");
        cr_expect(isnan(model_evaluate(m, x, bad, 4, NULL)));
        cr_expect(isnan(model_forward_backward(NULL, x, y, 1)));
        cr_expect(isnan(model_forward_backward(m, NULL, y, 1)));
        cr_expect(isnan(model_evaluate(m, x, NULL, 1, NULL)));
        p = snap;
        for (size_t i = 0; i < nt; i++) {
            model_tensor *ti = tensor(m, i);
            cr_expect(memcmp(p, ti->value, ti->n * sizeof *p) == 0, "a refused call wrote %s",
                      ti->name);
            cr_expect(memcmp(p + ti->n, ti->grad, ti->n * sizeof *p) == 0,
                      "a refused call wrote the gradient of %s", ti->name);
            p += 2 * ti->n;
        }
        free(snap);
        model_free(m);
    }
    cr_expect_null(model_create(MODEL_MLP, 0, 1));
    cr_expect_null(model_create(MODEL_CNN, 0, 1));
    cr_expect_null(model_create((model_kind)7, 4, 1));
    model_free(NULL);
    cr_expect_eq(model_tensor_count(NULL), 0);
    cr_expect_eq(model_param_count(NULL), 0);
}

Test(model, kind_names_parse_and_print) {
    model_kind k = MODEL_MLP;
    cr_expect_eq(model_kind_parse("softmax", &k), 0);
    cr_expect_eq(k, MODEL_SOFTMAX);
    cr_expect_eq(model_kind_parse("mlp", &k), 0);
    cr_expect_eq(k, MODEL_MLP);
    cr_expect_eq(model_kind_parse("cnn", &k), 0);
    cr_expect_eq(k, MODEL_CNN);
    const char *bad[] = {"", "MLP", "mlp ", "soft", "softmax2", "linear", "CNN", "cnn2", "conv"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        k = MODEL_SOFTMAX;
        cr_expect_eq(model_kind_parse(bad[i], &k), -1, "\"%s\" accepted", bad[i]);
        cr_expect_eq(k, MODEL_SOFTMAX, "\"%s\" changed the kind", bad[i]);
    }
    cr_expect_eq(model_kind_parse(NULL, &k), -1);
    cr_expect_str_eq(model_kind_name(MODEL_SOFTMAX), "softmax");
    cr_expect_str_eq(model_kind_name(MODEL_MLP), "mlp");
    cr_expect_str_eq(model_kind_name(MODEL_CNN), "cnn");
}
