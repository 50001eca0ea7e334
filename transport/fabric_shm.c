/* A shm region lock held by a dead process (libfabric 1.17's shm);
 * TERSE_SHM_RESCUE=1 only, experimental.
 *
 * libfabric 1.17's shm provider guards each endpoint's shared region (the
 * file /dev/shm/<name>) with a pthread spinlock inside the region. A
 * sender takes the receiver's lock while it writes a command into the
 * receiver's queue; the owner takes its own lock while it reads its
 * queue. A process SIGKILLed inside one of those sections leaves the lock
 * taken forever, and the next process that wants it spins inside
 * libfabric with no way out: the engine's watchdog then gives up on the
 * whole transport (algos/engine/engine.c). That turns one rank's death into the
 * loss of the survivors' transports in about one kill in six of the
 * three-server parameter-server test, which is what keeps failover from
 * working on shm every time.
 *
 * The rescue. When a provider call has been stuck for RESCUE_NS, some
 * rank's process (or a process a replacement took over from) is dead,
 * and no such process is stopped (a stopped one may be the holder, and
 * would resume inside the section), the lock the call spins on is
 * released:
 *   - a send (fi_tsend, fi_tinject) spins on the receiver's region lock;
 *   - fi_cq_read and fi_trecv on our own (fi_cancel and fi_close take no
 *     region lock in 1.17, so they are never rescued).
 * The region is mapped a second time from its file and its header checked
 * (the layout version and the owner's pid). Rescuers of one region take
 * turns (flock on its file). If the lock then stays taken for HOLD_NS more
 * while the call still spins, it is released with pthread_spin_unlock,
 * which only stores to the word. Only libfabric 1.17 on 64-bit (whose
 * header layout is below) is rescued.
 *
 * Why it is off by default (a review found these; SECURITY.md has them):
 *   - The holder is never identified. "A process of the job is dead, and
 *     the lock stayed taken for 300 + 20 ms" is also true of a live holder
 *     descheduled that long (a page fault, throttling, heavy load) after
 *     any earlier death; it would then share its section with another
 *     process. Sampling cannot tell one long hold from spinners handing
 *     the lock on back to back, either.
 *   - Not every section publishes its change with one store at the end:
 *     a sender killed after popping an inject buffer but before its
 *     `cmd_cnt--` leaves the count one above the free buffers, and a much
 *     later send into a full queue can then pop past the pool and corrupt
 *     the region. With TERSE_WIRE=mac a message garbled that way fails
 *     authentication; with none (the shm default) it would not. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* libfabric 1.17's struct smr_region (include/ofi_shm.h): u8 version, u8
 * resv, u16 flags, int pid, u8 cma_cap_peer, u8 cma_cap_self, u32
 * max_sar_buf_per_peer, void *base_addr, pthread_spinlock_t lock. */
#define SMR117_VERSION 4
#define SMR117_PID_OFF 4
#define SMR117_LOCK_OFF 24

/* A stuck call is rescued once it has lasted this long (a section lasts
 * microseconds; the watchdog gives up at 1 s). */
#define RESCUE_NS 300000000ull
/* ...and only if its lock stays taken for this long while we look. */
#define HOLD_NS 20000000ull

#define SHM_PREFIX "fi_shm://"

/* The region file's name and owner pid, from an endpoint name blob's
 * address ("fi_shm://PID:UID:terse-HEX"); 0 if it is not one. */
static int parse_shm_addr(const uint8_t *addr, size_t alen, char *file, size_t cap, pid_t *pid) {
    size_t n = strnlen((const char *)addr, alen);
    const size_t pl = sizeof SHM_PREFIX - 1;
    if (n <= pl || n - pl >= cap || memcmp(addr, SHM_PREFIX, pl) != 0) return 0;
    memcpy(file, addr + pl, n - pl);
    file[n - pl] = '\0';
    if (strchr(file, '/')) return 0;
    char *end = NULL;
    long p = strtol(file, &end, 10);
    if (!end || *end != ':' || p <= 0) return 0;
    *pid = (pid_t)p;
    return 1;
}

void terse__fabric_shm_note_peer(terse__fabric *f, int r, const uint8_t *addr, size_t alen) {
    if (!f->shm_rescue || sizeof(void *) != 8 || r < 0 || r >= f->nranks) return;
    if (!f->shm) {
        f->shm = calloc((size_t)f->nranks, sizeof *f->shm);
        if (!f->shm) return; /* no rescue then: the watchdog still gives up */
    }
    terse__fabric_shm_peer *p = &f->shm[r];
    if (p->pid > 0 && f->shm_ngone < TERSE__SHM_GONE_MAX) /* a replacement: keep the old pid */
        f->shm_gone[f->shm_ngone++] = p->pid;
    if (!parse_shm_addr(addr, alen, p->file, sizeof p->file, &p->pid)) p->pid = 0;
}

/* 'D'ead (or a zombie), 'S'topped, 'R'unning (anything else), or 0 for
 * no pid. */
static char proc_state(pid_t pid) {
    if (pid <= 0) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return errno == ENOENT ? 'D' : 'R';
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    const char *close = strrchr(buf, ')'); /* the command name may hold anything */
    if (!close || close[1] != ' ') return 'R';
    switch (close[2]) {
    case 'Z':
    case 'X': return 'D';
    case 'T':
    case 't': return 'S';
    default: return 'R';
    }
}

/* Release the lock of rank r's region if it stays taken for HOLD_NS
 * while the call that began at `since` still spins; 1 if it did. */
static int release(terse__fabric *f, int r, uint64_t since) {
    const terse__fabric_shm_peer *p = &f->shm[r];
    if (p->pid <= 0) return 0;
    char path[TERSE__NAME_ADDR_MAX + 16];
    snprintf(path, sizeof path, "/dev/shm/%s", p->file);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
             st.st_size >= 4096;
    /* One rescuer at a time per region (the owner spinning on its own lock
     * and every sender to it may all try): a later one samples afresh and
     * finds the lock changing hands. */
    for (int i = 0; ok && flock(fd, LOCK_EX | LOCK_NB) != 0; i++) {
        ok = i < 200;
        usleep(1000);
    }
    void *m = ok ? mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (m == MAP_FAILED) {
        close(fd); /* drops the flock too */
        return 0;
    }
    const uint8_t *hdr = m;
    int pid;
    memcpy(&pid, hdr + SMR117_PID_OFF, sizeof pid);
    /* glibc's own calls on the word, as libfabric's (x86-64 counts down
     * from 1 = free; the generic code, aarch64's, sets 0 = free to 1). */
    pthread_spinlock_t *lock = (pthread_spinlock_t *)((uint8_t *)m + SMR117_LOCK_OFF);
    int taken = hdr[0] == SMR117_VERSION && pid == p->pid;
    /* Taken all through HOLD_NS (a live holder's section lasts
     * microseconds), while the call still spins. */
    uint64_t t0 = terse__now_ns();
    while (taken && terse__now_ns() - t0 < HOLD_NS) {
        if (pthread_spin_trylock(lock) == 0) { /* free: ours for a moment, and no rescue */
            pthread_spin_unlock(lock);
            taken = 0;
        }
        usleep(HOLD_NS / 100000u);
    }
    if (taken && atomic_load_explicit(&f->call_since, memory_order_acquire) == since)
        pthread_spin_unlock(lock);
    else
        taken = 0;
    munmap(m, 4096);
    close(fd);
    return taken;
}

int terse__fabric_shm_rescue(terse__fabric *f) {
    if (f && f->side && terse__fabric_shm_rescue(f->side)) return 1;
    if (!f || !f->shm || atomic_load(&f->abandoned)) return 0;
    uint64_t since = atomic_load_explicit(&f->call_since, memory_order_acquire);
    uint64_t now = terse__now_ns();
    if (!since || now < since + RESCUE_NS || since == f->shm_tried) return 0;
    uint32_t v = fi_version();
    if (FI_MAJOR(v) != 1 || FI_MINOR(v) != 17) return 0;
    int peer = atomic_load_explicit(&f->call_peer, memory_order_relaxed);
    const char *what = atomic_load_explicit(&f->call_what, memory_order_relaxed);
    int is_send = what && (strcmp(what, "fi_tsend") == 0 || strcmp(what, "fi_tinject") == 0);
    int is_own = what && (strcmp(what, "fi_cq_read") == 0 || strcmp(what, "fi_trecv") == 0);
    if (!is_send && !is_own) return 0; /* fi_cancel, fi_close: no region lock in 1.17 */
    int owner = is_send && peer >= 0 && peer < f->nranks ? peer : f->rank;
    /* The dead (ranks, then replaced processes), for the message; a
     * stopped one may hold the lock and resume inside the section. */
    char dead[160] = "";
    size_t used = 0;
    for (int i = 0; i < f->nranks + f->shm_ngone; i++) {
        if (i == f->rank) continue;
        pid_t pid = i < f->nranks ? f->shm[i].pid : f->shm_gone[i - f->nranks];
        char s = proc_state(pid);
        if (s == 'S') return 0;
        if (s != 'D' || used >= sizeof dead - 40) continue;
        char who[24] = "a replaced rank";
        if (i < f->nranks) snprintf(who, sizeof who, "rank %d", i);
        used += (size_t)snprintf(dead + used, sizeof dead - used, "%s%s (pid %d)",
                                 used ? ", " : "", who, (int)pid);
    }
    if (!used) return 0; /* tried again at the next look: the death may show later */
    f->shm_tried = since; /* one release attempt per stuck call */
    if (!release(f, owner, since)) return 0;
    char region[32];
    if (owner == f->rank) snprintf(region, sizeof region, "its own");
    else snprintf(region, sizeof region, "rank %d's", owner);
    fprintf(stderr,
            "terse: rank %d: %s spun %llu ms on the lock of %s shm region while processes of "
            "the job are gone (%s); released the lock (libfabric 1.17 shm)\n",
            f->rank, what, (unsigned long long)((now - since) / 1000000u),
            region, dead);
    return 1;
}
