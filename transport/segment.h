/* A shared-memory segment owned by the ranks of one host (issue 28, item 4),
 * for collectives that read each other's data in place instead of copying
 * it through libfabric's shm (which moves every message with a CMA copy and
 * a region lock): Open MPI's coll/sm and xhc do the same.
 *
 * Life cycle. The host's first rank creates it (shm_open with O_CREAT |
 * O_EXCL, mode 0600, a name of 128 random bits: /terse-seg-<32 hex>), the
 * name travels through the job's store (authenticated by the job token),
 * the others attach (the file must be a regular file of the expected size,
 * owned by this user, mode 0600, carrying the creator's magic and its
 * random cookie), and once every member has said through the store that it
 * attached, the creator unlinks the name: from then on no other process can
 * open it, and it vanishes with the last member's mapping, however the
 * members end. So the only window in which another process can find it is
 * init, and only a process of the same user (mode 0600), which could ptrace
 * the ranks anyway (SECURITY.md).
 *
 * Layout: a header page (magic, members, step size, cookie), one 64-byte
 * line per flag per member (in, out, done: monotonic step counters each
 * member alone writes, read by all; its pid; its last call descriptor's
 * number), each member's ring of call descriptors, then the data: for each of two
 * parities, `members` input blocks of step_floats floats and one output
 * block of step_floats floats. The algorithm using it is
 * algos/coll/seg_allreduce.c. */
#ifndef TERSE_TRANSPORT_SEGMENT_H
#define TERSE_TRANSPORT_SEGMENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "terse.h"

typedef struct terse__seg terse__seg;

/* Room for "/terse-seg-" + 32 hex digits + NUL. */
#define TERSE__SEG_NAME 48

/* The flags of one member (each on a line of its own). */
typedef struct terse__seg_flags {
    _Atomic uint64_t in;   /* the last step whose input block it wrote */
    /* with in (written before its release): the call's element count and
     * op, so that ranks whose calls differ fail instead of mixing data
     * (TERSE_CHECK_CALLS=off sends no call descriptors) */
    _Atomic uint64_t call_n, call_op;
    _Atomic uint64_t call_codec; /* the codec's cut digest (0: dense) */
    char pad0[32];
    _Atomic uint64_t out;  /* the last step whose share of the sum it wrote */
    char pad1[56];
    _Atomic uint64_t done; /* the last step whose output it copied out */
    char pad2[56];
    _Atomic int64_t pid;   /* its process, for sentences */
    char pad3[56];
    _Atomic uint64_t desc_seq; /* the last call whose descriptor it wrote */
    char pad4[56];
    _Atomic uint64_t bar;  /* the last barrier it entered */
    /* a host's first member in a job over several hosts: the last barrier
     * it released its host from (every host arrived) */
    _Atomic uint64_t rel;
    char pad5[48];
} terse__seg_flags;

/* Call descriptors (algos/comm/comm_desc.c): each member's last
 * terse__seg_descs() (members + 1), call k in slot k % that, 64 bytes
 * each. A rank publishes call j + 1 only once its previous rank published
 * call j, so along the ring a rank is at most members - 1 calls ahead of
 * the next one, which is reading: members + 1 slots are never overwritten
 * while read. */
#define TERSE__SEG_DESC_BYTES 64

/* The creator: a fresh segment for `members` ranks, steps of step_floats
 * floats; its name (NUL-terminated) and cookie go to the others. */
terse_status terse__seg_create(int rank, int members, size_t step_floats,
                               char name[TERSE__SEG_NAME], uint64_t *cookie, terse__seg **out);
/* A member: attach to the creator's segment, checking what it is. */
terse_status terse__seg_attach(int rank, const char *name, int members, size_t step_floats,
                               uint64_t cookie, terse__seg **out);
/* The creator, once every member attached (or gave up): remove the name. */
void terse__seg_unlink(terse__seg *s);
/* Unmap (and unlink, if the creator has not yet). NULL is fine. */
void terse__seg_close(terse__seg *s);

/* The member other than `me` furthest behind: the fewest calls started
 * (desc_seq), then steps and barriers published -- the one a timeout
 * should name when the member awaited is itself waiting for it; `prefer`
 * (the member awaited, or -1) unless another is strictly further behind. */
int terse__seg_laggard(terse__seg *s, int me, int prefer);

int terse__seg_members(const terse__seg *s);
size_t terse__seg_step_floats(const terse__seg *s);
terse__seg_flags *terse__seg_flags_of(terse__seg *s, int member);
/* The slots of a member's descriptor ring, and member m's slot `slot`. */
int terse__seg_descs(const terse__seg *s);
uint8_t *terse__seg_desc(terse__seg *s, int member, int slot);
/* Member m's input block of parity p, and the output block of parity p. */
float *terse__seg_in(terse__seg *s, int parity, int member);
float *terse__seg_out(terse__seg *s, int parity);

#endif
