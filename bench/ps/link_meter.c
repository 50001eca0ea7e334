/* A network interface's two directions, watched while a timed operation
 * runs (ps_bench.h): bytes each way, and the share of the busy time in
 * which both directions were busy at once -- the duplex share. A thread
 * reads /sys/class/net/IFACE/statistics/{tx,rx}_bytes every millisecond;
 * a millisecond counts as busy in a direction that moved more than
 * LINK_BUSY_BYTES in it (16 Mbit/s: far below any link worth measuring,
 * far above ACKs and keep-alives). Linux only; where the files cannot be
 * read the meter is off and reports nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ps/ps_bench.h"

#define LINK_BUSY_BYTES 2000u

static struct {
    char tx[160], rx[160];
    pthread_t thread;
    int on;
    atomic_int stop, measuring;
    atomic_ullong any, both; /* busy milliseconds: either way, both ways */
} meter;

static int read_u64(const char *path, unsigned long long *v) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%llu", v) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static void *run(void *arg) {
    (void)arg;
    unsigned long long tx0 = 0, rx0 = 0;
    read_u64(meter.tx, &tx0);
    read_u64(meter.rx, &rx0);
    while (!atomic_load(&meter.stop)) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        unsigned long long tx = 0, rx = 0;
        if (read_u64(meter.tx, &tx) || read_u64(meter.rx, &rx)) continue;
        int up = tx - tx0 > LINK_BUSY_BYTES, down = rx - rx0 > LINK_BUSY_BYTES;
        tx0 = tx, rx0 = rx;
        if (!atomic_load(&meter.measuring)) continue;
        if (up || down) atomic_fetch_add(&meter.any, 1);
        if (up && down) atomic_fetch_add(&meter.both, 1);
    }
    return NULL;
}

int psb_link_start(const char *iface) {
    if (!iface || !*iface || strchr(iface, '/') || meter.on) return -1;
    snprintf(meter.tx, sizeof meter.tx, "/sys/class/net/%s/statistics/tx_bytes", iface);
    snprintf(meter.rx, sizeof meter.rx, "/sys/class/net/%s/statistics/rx_bytes", iface);
    unsigned long long v;
    if (read_u64(meter.tx, &v) || read_u64(meter.rx, &v)) return -1;
    atomic_store(&meter.stop, 0);
    if (pthread_create(&meter.thread, NULL, run, NULL) != 0) return -1;
    meter.on = 1;
    return 0;
}

void psb_link_begin(psb_link *l) {
    memset(l, 0, sizeof *l);
    if (!meter.on) return;
    read_u64(meter.tx, &l->tx);
    read_u64(meter.rx, &l->rx);
    atomic_store(&meter.any, 0);
    atomic_store(&meter.both, 0);
    atomic_store(&meter.measuring, 1);
}

void psb_link_end(psb_link *l) {
    if (!meter.on) return;
    atomic_store(&meter.measuring, 0);
    unsigned long long tx = 0, rx = 0;
    read_u64(meter.tx, &tx);
    read_u64(meter.rx, &rx);
    l->up = (double)(tx - l->tx);
    l->down = (double)(rx - l->rx);
    unsigned long long any = atomic_load(&meter.any), both = atomic_load(&meter.both);
    l->duplex = any ? (double)both / (double)any : 0.0;
    l->valid = 1;
}

void psb_link_stop(void) {
    if (!meter.on) return;
    atomic_store(&meter.stop, 1);
    pthread_join(meter.thread, NULL);
    meter.on = 0;
}
