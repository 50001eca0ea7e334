/* Exact top-k selection by magnitude in O(n): a radix select on the 31-bit
 * magnitude key, most significant digit first.
 *
 *   1. Histogram the top digit (key bits 30..20, 2048 bins) over all of x.
 *      Walking the bins from the top finds the bin b that holds the k-th
 *      largest key, and the rank r of that key inside b.
 *   2. Copy the elements of bin b into scratch (one more pass over x; usually
 *      a few percent of it), then histogram the next digit (bits 19..10) of
 *      just those, pick the bin and rank again, narrow the copy in place,
 *      and do the same for the last digit (bits 9..0). The three digits are
 *      the threshold key T, and r is how many elements with key T are kept.
 *   3. terse__topk_gather makes a final pass that keeps every key > T and
 *      the first r keys == T, in index order.
 *
 * So x is read three times whatever k is, and nothing is sorted. A bin too
 * big for the scratch (an input with huge runs of near-equal magnitudes)
 * is not copied: the next level histograms x again, counting only elements
 * whose higher digits match -- one extra pass instead of unbounded memory. */
#include "compress/topk_select.h"

#include <string.h>

#define SPARE TERSE_TOPK_MAX_BINS /* bin for elements outside the prefix */
#define STRIDE TERSE_TOPK_SUB_STRIDE
/* Sub-histogram counters are 32-bit; flushing them every 2^30 elements
 * keeps each of the four below 2^30. */
#define FLUSH_EVERY ((size_t)1 << 30)

static inline uint32_t key_at(const float *p) {
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u & 0x7fffffffu;
}

/* An element is in the current prefix when its key lies in [prefix,
 * prefix + low]: the fixed digits are the key's top bits. With keys below
 * 2^31, d = key - prefix is in the prefix iff neither d nor low - d is
 * negative, so the top bit of d | (low - d) says "outside": no compare, so
 * the same expression serves one key or four lanes. */
static inline uint32_t outside_bit(uint32_t key, uint32_t prefix, uint32_t low) {
    uint32_t d = key - prefix;
    return d | (low - d);
}

static inline uint32_t outside(uint32_t key, uint32_t prefix, uint32_t low) {
    return outside_bit(key, prefix, low) >> 31;
}

/* The pass that copies a bucket and the final pass skip runs of 16
 * elements that need no work after one test over the run. The tests use
 * GCC/clang vector extensions (what Debian's compilers give): baseline
 * SSE2 or NEON, no ISA flags, no dispatch. Plain loops are not reliably
 * vectorised here (GCC 12 keeps them scalar once unrolled), and the test
 * decides only whether to look closer, never what is kept. */
#define RUN 16
typedef uint32_t u32x4 __attribute__((vector_size(16)));

static inline u32x4 keys4(const float *p) {
    u32x4 v;
    memcpy(&v, p, sizeof v);
    return v & 0x7fffffffu;
}

/* Nonzero iff every element of the run is outside the prefix. */
static inline uint32_t run_all_outside(const float *p, uint32_t prefix, uint32_t low) {
    u32x4 d = keys4(p) - prefix, acc = d | (low - d);
    for (size_t l = 4; l < RUN; l += 4) {
        d = keys4(p + l) - prefix;
        acc &= d | (low - d);
    }
    return (acc[0] & acc[1] & acc[2] & acc[3]) >> 31;
}

/* Keys are below 2^31, so below - key (below = threshold - 1, which wraps
 * to 2^32 - 1 for threshold 0) has its top bit set exactly when key >=
 * threshold. Nonzero iff some key of the run is >= threshold. */
static inline uint32_t run_any_at_least(const float *p, uint32_t below) {
    u32x4 acc = below - keys4(p);
    for (size_t l = 4; l < RUN; l += 4) acc |= below - keys4(p + l);
    return (acc[0] | acc[1] | acc[2] | acc[3]) >> 31;
}

/* Count digit (key >> shift) & dmask of the elements of src in the prefix.
 * Gradients crowd into a few binades, so neighbours often hit the same
 * bin; four sub-histograms in rotation keep those increments from queueing
 * on one counter's store-to-load latency. Elements outside the prefix go to
 * a spare bin rather than through a branch. */
static void histogram(const float *src, size_t len, uint32_t prefix, uint32_t low,
                      unsigned shift, uint32_t dmask, terse_topk_scratch *s) {
    uint32_t *sub = s->sub;
    uint64_t *h = s->hist;
    size_t nb = (size_t)dmask + 1;
    memset(h, 0, nb * sizeof *h);
    for (size_t base = 0; base < len; base += FLUSH_EVERY) {
        size_t end = len - base <= FLUSH_EVERY ? len : base + FLUSH_EVERY;
        memset(sub, 0, 4 * STRIDE * sizeof *sub);
        size_t i = base;
        if (low == 0x7fffffffu && shift == 20) /* the top level, constants folded */
            for (; i + 4 <= end; i += 4)
                for (unsigned l = 0; l < 4; l++) {
                    uint32_t bits;
                    memcpy(&bits, src + i + l, sizeof bits);
                    sub[l * STRIDE + ((bits >> 20) & 0x7ffu)]++; /* drops the sign */
                }
        else
            for (; i + 4 <= end; i += 4)
                for (unsigned l = 0; l < 4; l++) {
                    uint32_t key = key_at(src + i + l);
                    uint32_t bin = outside(key, prefix, low) ? SPARE : (key >> shift) & dmask;
                    sub[l * STRIDE + bin]++;
                }
        for (; i < end; i++) {
            uint32_t key = key_at(src + i);
            sub[outside(key, prefix, low) ? SPARE : (key >> shift) & dmask]++;
        }
        for (size_t b = 0; b < nb; b++)
            h[b] += (uint64_t)sub[b] + sub[STRIDE + b] + sub[2 * STRIDE + b] + sub[3 * STRIDE + b];
    }
}

/* The bin, walking down from the top, that holds the rank-th largest key;
 * rank becomes the rank inside that bin. The caller guarantees rank <= the
 * total count, so the walk always stops. */
static uint32_t pick_bin(const uint64_t *h, uint32_t nb, uint64_t *rank) {
    uint32_t b = nb - 1;
    while (b > 0 && *rank > h[b]) *rank -= h[b--];
    return b;
}

/* Keep the elements of src in the prefix, in order, in dst (which may be
 * src). Runs with no match -- most of them when copying a bucket out of x
 * -- are skipped; inside a run the copy is branch-free: every element is
 * stored and the cursor advances only on a match, so dst needs one spare
 * slot. Bits are copied as integers so no float load can touch a NaN. */
#define NARROW_ONE(i)                                       \
    do {                                                    \
        uint32_t bits_;                                     \
        memcpy(&bits_, src + (i), sizeof bits_);            \
        memcpy(dst + m, &bits_, sizeof bits_);              \
        m += 1 - outside(bits_ & 0x7fffffffu, prefix, low); \
    } while (0)

static size_t narrow(const float *src, size_t len, uint32_t prefix, uint32_t low, float *dst) {
    size_t m = 0, i = 0;
    for (; i + RUN <= len; i += RUN) {
        if (run_all_outside(src + i, prefix, low)) continue;
        for (size_t l = 0; l < RUN; l++) NARROW_ONE(i + l);
    }
    for (; i < len; i++) NARROW_ONE(i);
    return m;
}

void terse__topk_threshold(const float *x, size_t n, size_t k, terse_topk_scratch *s,
                           uint32_t *threshold, size_t *take_equal) {
    static const unsigned shift[3] = {20, 10, 0};
    static const uint32_t dmask[3] = {0x7ff, 0x3ff, 0x3ff};
    const float *src = x;
    size_t len = n;
    uint32_t prefix = 0, low = 0x7fffffffu;  /* the digits chosen so far */
    uint32_t fprefix = 0, flow = 0x7fffffffu; /* the filter src still needs */
    uint64_t rank = k;
    for (int lv = 0; lv < 3; lv++) {
        histogram(src, len, fprefix, flow, shift[lv], dmask[lv], s);
        uint32_t b = pick_bin(s->hist, dmask[lv] + 1, &rank);
        uint64_t count = s->hist[b];
        prefix |= b << shift[lv];
        low = (1u << shift[lv]) - 1;
        if (lv == 2) break;
        if (src != x || count <= s->cand_cap) {
            len = narrow(src, len, prefix, low, s->cand);
            src = s->cand;
            fprefix = 0, flow = 0x7fffffffu; /* everything left is in the prefix */
        } else {
            fprefix = prefix, flow = low;
        }
    }
    *threshold = prefix;
    *take_equal = (size_t)rank;
}

/* One element of the final pass, branch-free: at ratios like 0.5 whether
 * an element is kept is a coin flip that a branch would mispredict. */
#define KEEP_ONE(i)                                                   \
    do {                                                              \
        uint32_t bits_;                                               \
        memcpy(&bits_, x + (i), sizeof bits_);                        \
        uint32_t key_ = bits_ & 0x7fffffffu;                          \
        size_t eq_ = key_ == threshold && eq_left != 0;               \
        size_t keep_ = (key_ > threshold) | eq_;                      \
        eq_left -= eq_;                                               \
        idx[m] = (i);                                                 \
        memcpy(val + m, &bits_, sizeof bits_); /* NaN bits verbatim */ \
        m += keep_;                                                   \
    } while (0)

size_t terse__topk_gather(const float *x, size_t n, uint32_t threshold, size_t take_equal,
                          uint64_t *idx, float *val) {
    size_t m = 0, eq_left = take_equal, i = 0;
    /* At small ratios most runs hold no key >= threshold. */
    for (; i + RUN <= n; i += RUN) {
        if (!run_any_at_least(x + i, threshold - 1)) continue;
        for (size_t l = 0; l < RUN; l++) KEEP_ONE(i + l);
    }
    for (; i < n; i++) KEEP_ONE(i);
    return m;
}
