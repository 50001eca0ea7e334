/* The two models of `terse-bench train`: softmax regression and a one-hidden-layer
 * ReLU MLP, forward and backward on OpenBLAS sgemm. Every buffer is allocated in
 * model_create, so a training step allocates nothing. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

struct model {
    model_kind kind;
    size_t max_batch;
    size_t n_tensors;
    model_tensor t[MODEL_MAX_TENSORS];
    float *hidden;  /* max_batch x HIDDEN: relu(x W1^T + b1) (MLP only) */
    float *dhidden; /* max_batch x HIDDEN: d loss / d hidden (MLP only) */
    float *logits;  /* max_batch x CLASSES: the logits, then d loss / d logits */
};

typedef struct {
    const char *name;
    size_t rows, cols, fan_in;
} tensor_shape;

/* In the order model_tensor_at gives them: a layer's weight, then its bias. */
static const tensor_shape softmax_shapes[] = {
    {"w", MODEL_CLASSES, MODEL_INPUTS, MODEL_INPUTS},
    {"b", MODEL_CLASSES, 1, MODEL_INPUTS},
};
static const tensor_shape mlp_shapes[] = {
    {"w1", MODEL_HIDDEN, MODEL_INPUTS, MODEL_INPUTS},
    {"b1", MODEL_HIDDEN, 1, MODEL_INPUTS},
    {"w2", MODEL_CLASSES, MODEL_HIDDEN, MODEL_HIDDEN},
    {"b2", MODEL_CLASSES, 1, MODEL_HIDDEN},
};

/* ---- initialisation */

/* splitmix64's output function. A library RNG is not used so that a seed gives
 * the same initial weights on every machine and with every libc. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* nn.Linear's default: U(-1/sqrt(fan_in), +1/sqrt(fan_in)) for weight and bias.
 * Element i of tensor `index` is a pure function of (seed, index, i). The top 24
 * bits make k in [0, 2^24); (k - 2^23) / 2^23 is exact in a float and lies in
 * [-1, 1), so after the one rounding of the product |value| <= (float)bound. */
static void init_uniform(float *v, size_t n, uint64_t seed, size_t index, size_t fan_in) {
    const double bound = 1.0 / sqrt((double)fan_in);
    uint64_t base = mix64(seed ^ 0x6d6f64656c5f696eu) ^ mix64(0xa0761d6478bd642fu * (index + 1));
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix64(base + 0x9e3779b97f4a7c15u * (uint64_t)(i + 1));
        double u = ((double)(r >> 40) - 8388608.0) / 8388608.0;
        v[i] = (float)(u * bound);
    }
}

/* ---- create and free */

static float *alloc_floats(size_t n) {
    void *p = NULL;
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

model *model_create(model_kind kind, size_t max_batch, uint64_t seed) {
    /* sgemm takes int dimensions: the largest product, max_batch x 784, must fit. */
    if (max_batch == 0 || max_batch > (size_t)INT_MAX / MODEL_INPUTS) return NULL;
    const tensor_shape *shapes;
    size_t count;
    if (kind == MODEL_SOFTMAX) {
        shapes = softmax_shapes;
        count = sizeof softmax_shapes / sizeof softmax_shapes[0];
    } else if (kind == MODEL_MLP) {
        shapes = mlp_shapes;
        count = sizeof mlp_shapes / sizeof mlp_shapes[0];
    } else {
        return NULL;
    }
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->kind = kind;
    m->max_batch = max_batch;
    m->n_tensors = count;
    for (size_t i = 0; i < count; i++) {
        model_tensor *t = &m->t[i];
        t->name = shapes[i].name;
        t->rows = shapes[i].rows;
        t->cols = shapes[i].cols;
        t->n = t->rows * t->cols;
        t->value = alloc_floats(t->n);
        t->grad = alloc_floats(t->n);
        if (!t->value || !t->grad) goto fail;
        init_uniform(t->value, t->n, seed, i, shapes[i].fan_in);
    }
    m->logits = alloc_floats(max_batch * MODEL_CLASSES);
    if (!m->logits) goto fail;
    if (kind == MODEL_MLP) {
        m->hidden = alloc_floats(max_batch * MODEL_HIDDEN);
        m->dhidden = alloc_floats(max_batch * MODEL_HIDDEN);
        if (!m->hidden || !m->dhidden) goto fail;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_free(model *m) {
    if (!m) return;
    for (size_t i = 0; i < MODEL_MAX_TENSORS; i++) {
        free(m->t[i].value);
        free(m->t[i].grad);
    }
    free(m->hidden);
    free(m->dhidden);
    free(m->logits);
    free(m);
}

size_t model_tensor_count(const model *m) { return m ? m->n_tensors : 0; }

model_tensor *model_tensor_at(model *m, size_t i) {
    return m && i < m->n_tensors ? &m->t[i] : NULL;
}

size_t model_param_count(const model *m) {
    size_t n = 0;
    for (size_t i = 0; m && i < m->n_tensors; i++) n += m->t[i].n;
    return n;
}

/* ---- forward */

/* out (b x n) = in (b x k) W^T + bias, W n x k: each row starts as the bias and
 * sgemm adds the product onto it (beta = 1). */
static void linear(const float *in, size_t b, size_t k, const model_tensor *w,
                   const model_tensor *bias, float *out) {
    size_t n = w->rows;
    for (size_t r = 0; r < b; r++) memcpy(out + r * n, bias->value, n * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)b, (blasint)n, (blasint)k, 1.0f,
                in, (blasint)k, w->value, (blasint)k, 1.0f, out, (blasint)n);
}

/* Leaves the logits in m->logits (and relu of the hidden layer in m->hidden). */
static void forward(model *m, const float *x, size_t b) {
    if (m->kind == MODEL_SOFTMAX) {
        linear(x, b, MODEL_INPUTS, &m->t[0], &m->t[1], m->logits);
        return;
    }
    float *h = m->hidden;
    linear(x, b, MODEL_INPUTS, &m->t[0], &m->t[1], h);
    for (size_t i = 0; i < b * MODEL_HIDDEN; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
    linear(h, b, MODEL_HIDDEN, &m->t[2], &m->t[3], m->logits);
}

/* The cross-entropy of one row of logits, -log softmax(z)[y] = lse(z) - z[y],
 * in double after subtracting the row's maximum so exp never overflows. With
 * dz non-NULL also writes (softmax(z) - onehot(y)) * scale into dz (which may
 * be z itself: every z is read before any is written). */
static double row_loss(const float *z, unsigned y, float *dz, double scale) {
    float zmax = z[0];
    for (unsigned j = 1; j < MODEL_CLASSES; j++) zmax = z[j] > zmax ? z[j] : zmax;
    double sum = 0.0;
    for (unsigned j = 0; j < MODEL_CLASSES; j++) sum += exp((double)z[j] - (double)zmax);
    double lse = (double)zmax + log(sum);
    double loss = lse - (double)z[y];
    if (dz) {
        double p[MODEL_CLASSES];
        for (unsigned j = 0; j < MODEL_CLASSES; j++) p[j] = exp((double)z[j] - lse);
        for (unsigned j = 0; j < MODEL_CLASSES; j++)
            dz[j] = (float)((p[j] - (j == y ? 1.0 : 0.0)) * scale);
    }
    return loss;
}

/* The bad inputs the header rules out, answered with NaN instead of an
 * out-of-bounds access: no model or data, a batch outside [1, max_batch], or a
 * label that is not a class (it would index past the logits). */
static int batch_ok(const model *m, const float *x, const uint8_t *y, size_t b) {
    if (!m || !x || !y || b == 0 || b > m->max_batch) return 0;
    for (size_t i = 0; i < b; i++)
        if (y[i] >= MODEL_CLASSES) return 0;
    return 1;
}

/* ---- backward */

/* bias grad (n) = the column sums of d (b x n). */
static void column_sums(const float *d, size_t b, size_t n, float *out) {
    memset(out, 0, n * sizeof(float));
    for (size_t r = 0; r < b; r++)
        for (size_t j = 0; j < n; j++) out[j] += d[r * n + j];
}

/* Given d out (b x n) for out = in W^T + bias with in b x k: dW = dout^T in
 * (n x k), dbias = column sums of dout. */
static void linear_grad(const float *dout, const float *in, size_t b, size_t k, model_tensor *w,
                        model_tensor *bias) {
    size_t n = w->rows;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)n, (blasint)k, (blasint)b, 1.0f,
                dout, (blasint)n, in, (blasint)k, 0.0f, w->grad, (blasint)k);
    column_sums(dout, b, n, bias->grad);
}

static void backward(model *m, const float *x, size_t b) {
    const float *dz = m->logits;
    if (m->kind == MODEL_SOFTMAX) {
        linear_grad(dz, x, b, MODEL_INPUTS, &m->t[0], &m->t[1]);
        return;
    }
    const float *h = m->hidden;
    float *dh = m->dhidden;
    linear_grad(dz, h, b, MODEL_HIDDEN, &m->t[2], &m->t[3]);
    /* d hidden = dz W2 (b x 256), then through the ReLU: hidden > 0 exactly
     * where the pre-activation was, so the relu output serves as the mask. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)b, MODEL_HIDDEN, MODEL_CLASSES,
                1.0f, dz, MODEL_CLASSES, m->t[2].value, MODEL_HIDDEN, 0.0f, dh, MODEL_HIDDEN);
    for (size_t i = 0; i < b * MODEL_HIDDEN; i++) dh[i] = h[i] > 0.0f ? dh[i] : 0.0f;
    linear_grad(dh, x, b, MODEL_INPUTS, &m->t[0], &m->t[1]);
}

/* ---- the two entry points */

double model_forward_backward(model *m, const float *x, const uint8_t *y, size_t b) {
    if (!batch_ok(m, x, y, b)) return NAN;
    forward(m, x, b);
    /* d(mean loss)/dz = (softmax - onehot) / b, written over the logits. */
    double total = 0.0, scale = 1.0 / (double)b;
    for (size_t i = 0; i < b; i++) {
        float *z = m->logits + i * MODEL_CLASSES;
        total += row_loss(z, y[i], z, scale);
    }
    backward(m, x, b);
    return total / (double)b;
}

double model_evaluate(model *m, const float *x, const uint8_t *y, size_t b, size_t *correct) {
    if (correct) *correct = 0;
    if (!batch_ok(m, x, y, b)) return NAN;
    forward(m, x, b);
    double total = 0.0;
    size_t right = 0;
    for (size_t i = 0; i < b; i++) {
        const float *z = m->logits + i * MODEL_CLASSES;
        total += row_loss(z, y[i], NULL, 0.0);
        /* Strictly greater, so a tie keeps the lower class. */
        unsigned best = 0;
        for (unsigned j = 1; j < MODEL_CLASSES; j++)
            if (z[j] > z[best]) best = j;
        right += best == y[i];
    }
    if (correct) *correct = right;
    return total / (double)b;
}

/* ---- names */

int model_kind_parse(const char *text, model_kind *kind) {
    if (!text || !kind) return -1;
    if (strcmp(text, "softmax") == 0) {
        *kind = MODEL_SOFTMAX;
    } else if (strcmp(text, "mlp") == 0) {
        *kind = MODEL_MLP;
    } else {
        return -1;
    }
    return 0;
}

const char *model_kind_name(model_kind kind) {
    switch (kind) {
    case MODEL_SOFTMAX: return "softmax";
    case MODEL_MLP: return "mlp";
    }
    return "unknown";
}
