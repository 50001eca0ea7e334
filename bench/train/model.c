/* The three models of `terse-bench train`: softmax regression, a one-hidden-layer
 * ReLU MLP and a small LeNet-style CNN, forward and backward on OpenBLAS sgemm
 * (the CNN's convolutions through im2col). Every buffer is allocated in
 * model_create, so a training step allocates nothing. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

/* The CNN's geometry (train.h): 5x5 kernels without padding, 2x2 pools. */
#define CNN_SIDE 28 /* the input image */
#define CNN_K 5
#define CNN_KK (CNN_K * CNN_K)
#define CNN_C1 16
#define CNN_A1 24 /* conv1's output side, 28 - 5 + 1 */
#define CNN_P1 12
#define CNN_C2 32
#define CNN_A2 8 /* conv2's output side, 12 - 5 + 1 */
#define CNN_P2 4
#define CNN_FEATURES (CNN_C2 * CNN_P2 * CNN_P2) /* 512 */
#define CNN_HIDDEN 128
/* Images per pass through the network. The workspace holds one chunk (about
 * 240 KB an image, most of it the two im2col matrices), so memory is bounded
 * whatever max_batch is. Small chunks stay in cache: at batch 64, chunks of
 * 4 to 12 images took 6.5-7.5 ms a step, 32 took 10 and 64 took 11. */
#define CNN_CHUNK 8

/* The CNN's workspace for one chunk of at most `chunk` images. Activations are
 * laid out channel-major across the chunk: row c of a C x (n * side^2) matrix
 * holds channel c of every image, image after image, so one sgemm convolves
 * the whole chunk. */
typedef struct {
    size_t chunk;
    float *col1;     /* 25 x (chunk*576): conv1's im2col of the input */
    float *act1;     /* 16 x (chunk*576): conv1's output, then its gradient */
    float *pool1;    /* 16 x (chunk*144): relu(max-pool(act1) + c1) */
    float *dpool1;   /* 16 x (chunk*144): d loss / d pool1 */
    uint32_t *arg1;  /* 16 x (chunk*144): where in act1 each pool1 maximum is */
    float *col2;     /* 400 x (chunk*64): conv2's im2col of pool1, then its gradient */
    float *act2;     /* 32 x (chunk*64): conv2's output, then its gradient */
    float *feat;     /* chunk x 512: relu(max-pool(act2) + c2), flattened */
    float *dfeat;    /* chunk x 512 */
    uint32_t *arg2;  /* chunk x 512: where in act2 each feature's maximum is */
    void *block;     /* one allocation that holds all of the above */
} cnn_work;

struct model {
    model_kind kind;
    size_t max_batch;
    size_t n_tensors;
    model_tensor t[MODEL_MAX_TENSORS];
    /* The last hidden layer: max_batch x HIDDEN (MLP), chunk x CNN_HIDDEN (CNN). */
    float *hidden;  /* its ReLU output */
    float *dhidden; /* d loss / d hidden */
    float *logits;  /* max_batch (CNN: chunk) x CLASSES: the logits, then d loss / d logits */
    cnn_work cnn;   /* CNN only */
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
/* A kernel is out x (in*5*5); fan_in is in*5*5, as nn.Conv2d counts it. */
static const tensor_shape cnn_shapes[] = {
    {"k1", CNN_C1, CNN_KK, CNN_KK},
    {"c1", CNN_C1, 1, CNN_KK},
    {"k2", CNN_C2, CNN_C1 * CNN_KK, CNN_C1 * CNN_KK},
    {"c2", CNN_C2, 1, CNN_C1 * CNN_KK},
    {"w3", CNN_HIDDEN, CNN_FEATURES, CNN_FEATURES},
    {"b3", CNN_HIDDEN, 1, CNN_FEATURES},
    {"w4", MODEL_CLASSES, CNN_HIDDEN, CNN_HIDDEN},
    {"b4", MODEL_CLASSES, 1, CNN_HIDDEN},
};

/* ---- initialisation */

/* splitmix64's output function. A library RNG is not used so that a seed gives
 * the same initial weights on every machine and with every libc. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* nn.Linear's and nn.Conv2d's default: U(-1/sqrt(fan_in), +1/sqrt(fan_in)) for
 * weight and bias.
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

/* Room for n elements of `size` bytes at offset *at of base (NULL while only
 * measuring); *at moves on to the next 64-byte boundary after them. */
static void *carve(unsigned char *base, size_t *at, size_t n, size_t size) {
    void *p = base ? base + *at : NULL;
    *at += (n * size + 63) & ~(size_t)63;
    return p;
}

/* Lay the CNN's workspace out in one block for chunks of `chunk` images; with
 * base NULL only measures it. Returns its size in bytes. */
static size_t cnn_layout(cnn_work *w, size_t chunk, unsigned char *base) {
    size_t at = 0;
    size_t n1 = chunk * CNN_A1 * CNN_A1, p1 = chunk * CNN_P1 * CNN_P1;
    size_t n2 = chunk * CNN_A2 * CNN_A2, nf = chunk * CNN_FEATURES;
    w->chunk = chunk;
    w->col1 = carve(base, &at, CNN_KK * n1, sizeof(float));
    w->act1 = carve(base, &at, CNN_C1 * n1, sizeof(float));
    w->pool1 = carve(base, &at, CNN_C1 * p1, sizeof(float));
    w->dpool1 = carve(base, &at, CNN_C1 * p1, sizeof(float));
    w->arg1 = carve(base, &at, CNN_C1 * p1, sizeof(uint32_t));
    w->col2 = carve(base, &at, CNN_C1 * CNN_KK * n2, sizeof(float));
    w->act2 = carve(base, &at, CNN_C2 * n2, sizeof(float));
    w->feat = carve(base, &at, nf, sizeof(float));
    w->dfeat = carve(base, &at, nf, sizeof(float));
    w->arg2 = carve(base, &at, nf, sizeof(uint32_t));
    return at;
}

static int cnn_alloc(model *m) {
    size_t chunk = m->max_batch < CNN_CHUNK ? m->max_batch : CNN_CHUNK;
    size_t bytes = cnn_layout(&m->cnn, chunk, NULL);
    void *block = NULL;
    if (posix_memalign(&block, 64, bytes) != 0) return -1;
    cnn_layout(&m->cnn, chunk, block);
    m->cnn.block = block;
    m->hidden = alloc_floats(chunk * CNN_HIDDEN);
    m->dhidden = alloc_floats(chunk * CNN_HIDDEN);
    m->logits = alloc_floats(chunk * MODEL_CLASSES);
    return m->hidden && m->dhidden && m->logits ? 0 : -1;
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
    } else if (kind == MODEL_CNN) {
        shapes = cnn_shapes;
        count = sizeof cnn_shapes / sizeof cnn_shapes[0];
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
    if (kind == MODEL_CNN) {
        if (cnn_alloc(m) != 0) goto fail;
        return m;
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
    free(m->cnn.block);
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

/* Adds the cross-entropies of the n rows of logits z to *total and, with right
 * non-NULL, how many rows' arg-max is the label (strictly greater, so a tie
 * keeps the lower class) to *right. With grad, overwrites each row with
 * d(mean loss)/dz = (softmax - onehot) * scale. */
static void score_rows(float *z, const uint8_t *y, size_t n, int grad, double scale,
                       double *total, size_t *right) {
    for (size_t i = 0; i < n; i++, z += MODEL_CLASSES) {
        if (right) {
            unsigned best = 0;
            for (unsigned j = 1; j < MODEL_CLASSES; j++)
                if (z[j] > z[best]) best = j;
            *right += best == y[i];
        }
        *total += row_loss(z, y[i], grad ? z : NULL, scale);
    }
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

/* bias grad (n) = the column sums of d (b x n), added to out if accumulate. */
static void column_sums(const float *d, size_t b, size_t n, float *out, int accumulate) {
    if (!accumulate) memset(out, 0, n * sizeof(float));
    for (size_t r = 0; r < b; r++)
        for (size_t j = 0; j < n; j++) out[j] += d[r * n + j];
}

/* Given d out (b x n) for out = in W^T + bias with in b x k: dW = dout^T in
 * (n x k), dbias = column sums of dout; written over the grads, or added to
 * them if accumulate (the CNN sums its chunks so). */
static void linear_grad(const float *dout, const float *in, size_t b, size_t k, model_tensor *w,
                        model_tensor *bias, int accumulate) {
    size_t n = w->rows;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)n, (blasint)k, (blasint)b, 1.0f,
                dout, (blasint)n, in, (blasint)k, accumulate ? 1.0f : 0.0f, w->grad, (blasint)k);
    column_sums(dout, b, n, bias->grad, accumulate);
}

/* d in (b x k) = dout (b x n) W for out = in W^T + bias, W n x k, then through
 * the ReLU that made in: in > 0 exactly where its pre-activation was, so the
 * relu output serves as the mask. */
static void relu_input_grad(const float *dout, const model_tensor *w, const float *in, size_t b,
                            float *din) {
    size_t n = w->rows, k = w->cols;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)b, (blasint)k, (blasint)n,
                1.0f, dout, (blasint)n, w->value, (blasint)k, 0.0f, din, (blasint)k);
    for (size_t i = 0; i < b * k; i++) din[i] = in[i] > 0.0f ? din[i] : 0.0f;
}

static void backward(model *m, const float *x, size_t b) {
    const float *dz = m->logits;
    if (m->kind == MODEL_SOFTMAX) {
        linear_grad(dz, x, b, MODEL_INPUTS, &m->t[0], &m->t[1], 0);
        return;
    }
    linear_grad(dz, m->hidden, b, MODEL_HIDDEN, &m->t[2], &m->t[3], 0);
    relu_input_grad(dz, &m->t[2], m->hidden, b, m->dhidden);
    linear_grad(m->dhidden, x, b, MODEL_INPUTS, &m->t[0], &m->t[1], 0);
}

/* ---- the CNN */

/* col ((cin*25) x (n*out*out), out = side - 4) = the 5x5 patches of n images of
 * cin channels, pixel (c, i, y, x) at src[c*c_stride + i*i_stride + y*side + x]:
 * row ic*25 + ky*5 + kx, column i*out*out + oy*out + ox holds pixel
 * (ic, i, oy+ky, ox+kx). Then kernel (cout x cin*25) times col is the
 * convolution, channel-major across the images. */
static void im2col(const float *src, size_t cin, size_t n, size_t side, size_t c_stride,
                   size_t i_stride, float *col) {
    size_t out = side - CNN_K + 1, plane = out * out;
    for (size_t ic = 0; ic < cin; ic++)
        for (size_t ky = 0; ky < CNN_K; ky++)
            for (size_t kx = 0; kx < CNN_K; kx++) {
                float *row = col + ((ic * CNN_K + ky) * CNN_K + kx) * n * plane;
                for (size_t i = 0; i < n; i++) {
                    const float *in = src + ic * c_stride + i * i_stride + ky * side + kx;
                    for (size_t oy = 0; oy < out; oy++)
                        memcpy(row + i * plane + oy * out, in + oy * side, out * sizeof(float));
                }
            }
}

/* The adjoint of im2col: dst (laid out as src was, cin x (n*side*side)
 * channel-major, i_stride side*side) = the sum, over every patch that holds a
 * pixel, of that patch entry's gradient in col. */
static void col2im(const float *col, size_t cin, size_t n, size_t side, float *dst) {
    size_t out = side - CNN_K + 1, plane = out * out, c_stride = n * side * side;
    memset(dst, 0, cin * c_stride * sizeof(float));
    for (size_t ic = 0; ic < cin; ic++)
        for (size_t ky = 0; ky < CNN_K; ky++)
            for (size_t kx = 0; kx < CNN_K; kx++) {
                const float *row = col + ((ic * CNN_K + ky) * CNN_K + kx) * n * plane;
                for (size_t i = 0; i < n; i++) {
                    float *d = dst + ic * c_stride + i * side * side + ky * side + kx;
                    for (size_t oy = 0; oy < out; oy++)
                        for (size_t ox = 0; ox < out; ox++)
                            d[oy * side + ox] += row[i * plane + oy * out + ox];
                }
            }
}

/* One row of 2x2 windows: the rows r0, r1 of act (r0 starting at act index
 * row) pooled into o[0..half), each window's maximum (the first in scan order
 * on a tie) + bias, clipped at zero, and the maximum's act index into a.
 * Selects rather than branches, so that the loop vectorises: which value wins
 * is data, and a branching version spent more time here, mispredicting, than
 * in the sgemm of conv1. */
static void pool_row(const float *restrict r0, const float *restrict r1, size_t half,
                     uint32_t side, uint32_t row, float bias, float *restrict o,
                     uint32_t *restrict a) {
    for (size_t px = 0; px < half; px++) {
        uint32_t at = (uint32_t)(2 * px), best = at;
        float v = r0[2 * px], t = r0[2 * px + 1];
        best = t > v ? at + 1 : best;
        v = t > v ? t : v;
        t = r1[2 * px];
        best = t > v ? side + at : best;
        v = t > v ? t : v;
        t = r1[2 * px + 1];
        best = t > v ? side + at + 1 : best;
        v = t > v ? t : v;
        v += bias;
        o[px] = v > 0.0f ? v : 0.0f;
        a[px] = row + best;
    }
}

/* out = relu(max over each 2x2 window of act + bias), for act ch x
 * (n*side*side) channel-major: pooled pixel (c, i, py, px) goes to
 * out[c*c_stride + i*i_stride + py*(side/2) + px], and the index in act of the
 * window's maximum to arg at the same place. This is the layer's conv + bias,
 * ReLU, max-pool: a channel's bias moves all four values alike and ReLU is
 * monotone, so both commute with the max, and adding the bias and clipping
 * after it does a quarter of the work. */
static void pool_relu(const float *act, size_t ch, size_t n, size_t side, const float *bias,
                      float *out, uint32_t *arg, size_t c_stride, size_t i_stride) {
    size_t half = side / 2;
    for (size_t c = 0; c < ch; c++)
        for (size_t i = 0; i < n; i++)
            for (size_t py = 0; py < half; py++) {
                size_t row = (c * n + i) * side * side + 2 * py * side;
                size_t o = c * c_stride + i * i_stride + py * half;
                pool_row(act + row, act + row + side, half, (uint32_t)side, (uint32_t)row,
                         bias[c], out + o, arg + o);
            }
}

/* The backward of pool_relu (same arguments, with the gradient dout laid out
 * as out): dact = dout at each active window's maximum, zero elsewhere; and
 * the bias gradient, the sum of the active douts per channel, added to dbias. */
static void unpool_relu(const float *dout, const float *out, const uint32_t *arg, size_t ch,
                        size_t n, size_t side, size_t c_stride, size_t i_stride, float *dact,
                        float *dbias) {
    size_t half = side / 2;
    memset(dact, 0, ch * n * side * side * sizeof(float));
    for (size_t c = 0; c < ch; c++) {
        float sum = 0.0f;
        for (size_t i = 0; i < n; i++)
            for (size_t p = 0; p < half * half; p++) {
                size_t o = c * c_stride + i * i_stride + p;
                if (out[o] > 0.0f) {
                    dact[arg[o]] = dout[o];
                    sum += dout[o];
                }
            }
        dbias[c] += sum;
    }
}

/* C (m x n) = A (m x k) B (k x n), with A or B read transposed when ta or tb,
 * plus beta C. */
static void gemm(int ta, int tb, size_t m, size_t n, size_t k, const float *a, const float *b,
                 float beta, float *c) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)(ta ? m : k), b,
                (blasint)(tb ? k : n), beta, c, (blasint)n);
}

/*
 * n <= chunk images x (labels y) through the CNN: adds their losses to *total
 * and their right answers to *right (if non-NULL); with grad, also adds
 * d(loss)/d(param) * scale to every grad. Each image's logits, and so its
 * share of the gradient, depend on that image alone, so summing chunk after
 * chunk gives what the whole batch at once would (up to float rounding).
 */
static void cnn_chunk(model *m, const float *x, const uint8_t *y, size_t n, int grad, double scale,
                      double *total, size_t *right) {
    cnn_work *w = &m->cnn;
    model_tensor *k1 = &m->t[0], *c1 = &m->t[1], *k2 = &m->t[2], *c2 = &m->t[3];
    size_t n1 = n * CNN_A1 * CNN_A1, p1 = n * CNN_P1 * CNN_P1, n2 = n * CNN_A2 * CNN_A2;
    size_t plane1 = CNN_P1 * CNN_P1, plane2 = CNN_P2 * CNN_P2;

    /* 1. conv1: act1 (16 x n*576) = k1 (16 x 25) col1 (25 x n*576); then
     *    pool1 = relu(max-pool(act1) + c1), 16 x (n*144). */
    im2col(x, 1, n, CNN_SIDE, 0, MODEL_INPUTS, w->col1);
    gemm(0, 0, CNN_C1, n1, CNN_KK, k1->value, w->col1, 0.0f, w->act1);
    pool_relu(w->act1, CNN_C1, n, CNN_A1, c1->value, w->pool1, w->arg1, p1, plane1);
    /* 2. conv2: act2 (32 x n*64) = k2 (32 x 400) col2 (400 x n*64); its pool
     *    writes image i's channel c, pixel (y, x) to feature c*16 + y*4 + x of
     *    row i of feat (n x 512), which is the flatten. */
    im2col(w->pool1, CNN_C1, n, CNN_P1, p1, plane1, w->col2);
    gemm(0, 0, CNN_C2, n2, CNN_C1 * CNN_KK, k2->value, w->col2, 0.0f, w->act2);
    pool_relu(w->act2, CNN_C2, n, CNN_A2, c2->value, w->feat, w->arg2, plane2, CNN_FEATURES);
    /* 3. the fully connected layers and the loss, as the MLP's. */
    float *h = m->hidden;
    linear(w->feat, n, CNN_FEATURES, &m->t[4], &m->t[5], h);
    for (size_t i = 0; i < n * CNN_HIDDEN; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
    linear(h, n, CNN_HIDDEN, &m->t[6], &m->t[7], m->logits);
    score_rows(m->logits, y, n, grad, scale, total, right);
    if (!grad) return;

    /* 4. back through the fully connected layers to dfeat (n x 512). */
    linear_grad(m->logits, h, n, CNN_HIDDEN, &m->t[6], &m->t[7], 1);
    relu_input_grad(m->logits, &m->t[6], h, n, m->dhidden);
    linear_grad(m->dhidden, w->feat, n, CNN_FEATURES, &m->t[4], &m->t[5], 1);
    relu_input_grad(m->dhidden, &m->t[4], w->feat, n, w->dfeat);
    /* 5. conv2: route dfeat to the pool maxima (dact2, over act2), then
     *    dk2 += dact2 col2^T, and d col2 = k2^T dact2 (over col2, now used),
     *    which col2im sums back onto the pixels of pool1. */
    unpool_relu(w->dfeat, w->feat, w->arg2, CNN_C2, n, CNN_A2, plane2, CNN_FEATURES, w->act2,
                c2->grad);
    gemm(0, 1, CNN_C2, CNN_C1 * CNN_KK, n2, w->act2, w->col2, 1.0f, k2->grad);
    gemm(1, 0, CNN_C1 * CNN_KK, n2, CNN_C2, k2->value, w->act2, 0.0f, w->col2);
    col2im(w->col2, CNN_C1, n, CNN_P1, w->dpool1);
    /* 6. conv1: the same routing (dact1 over act1), then dk1 += dact1 col1^T.
     *    The input needs no gradient. */
    unpool_relu(w->dpool1, w->pool1, w->arg1, CNN_C1, n, CNN_A1, p1, plane1, w->act1, c1->grad);
    gemm(0, 1, CNN_C1, CNN_KK, n1, w->act1, w->col1, 1.0f, k1->grad);
}

/* The batch chunk by chunk; with grad, the grads start from zero. */
static double cnn_pass(model *m, const float *x, const uint8_t *y, size_t b, int grad,
                       size_t *right) {
    if (grad)
        for (size_t i = 0; i < m->n_tensors; i++)
            memset(m->t[i].grad, 0, m->t[i].n * sizeof(float));
    double total = 0.0, scale = 1.0 / (double)b;
    for (size_t at = 0; at < b; at += m->cnn.chunk) {
        size_t n = b - at < m->cnn.chunk ? b - at : m->cnn.chunk;
        cnn_chunk(m, x + at * MODEL_INPUTS, y + at, n, grad, scale, &total, right);
    }
    return total / (double)b;
}

/* ---- the two entry points */

double model_forward_backward(model *m, const float *x, const uint8_t *y, size_t b) {
    if (!batch_ok(m, x, y, b)) return NAN;
    if (m->kind == MODEL_CNN) return cnn_pass(m, x, y, b, 1, NULL);
    forward(m, x, b);
    /* d(mean loss)/dz = (softmax - onehot) / b, written over the logits. */
    double total = 0.0;
    score_rows(m->logits, y, b, 1, 1.0 / (double)b, &total, NULL);
    backward(m, x, b);
    return total / (double)b;
}

double model_evaluate(model *m, const float *x, const uint8_t *y, size_t b, size_t *correct) {
    if (correct) *correct = 0;
    if (!batch_ok(m, x, y, b)) return NAN;
    size_t right = 0;
    double loss;
    if (m->kind == MODEL_CNN) {
        loss = cnn_pass(m, x, y, b, 0, &right);
    } else {
        forward(m, x, b);
        double total = 0.0;
        score_rows(m->logits, y, b, 0, 0.0, &total, &right);
        loss = total / (double)b;
    }
    if (correct) *correct = right;
    return loss;
}

/* ---- names */

int model_kind_parse(const char *text, model_kind *kind) {
    if (!text || !kind) return -1;
    if (strcmp(text, "softmax") == 0) {
        *kind = MODEL_SOFTMAX;
    } else if (strcmp(text, "mlp") == 0) {
        *kind = MODEL_MLP;
    } else if (strcmp(text, "cnn") == 0) {
        *kind = MODEL_CNN;
    } else {
        return -1;
    }
    return 0;
}

const char *model_kind_name(model_kind kind) {
    switch (kind) {
    case MODEL_SOFTMAX: return "softmax";
    case MODEL_MLP: return "mlp";
    case MODEL_CNN: return "cnn";
    }
    return "unknown";
}
