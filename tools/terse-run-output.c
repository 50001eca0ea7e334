/* terse-run: copy each rank's output to ours, one whole line at a time with
 * "[rank] " in front, so lines from different ranks never mix mid-line
 * (except lines longer than TERSE_RUN_LINE_MAX, which go out in pieces). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "terse-run.h"

/* Once writing to our stdout or stderr fails (a closed pipe, a full disk),
 * we stop writing there but keep reading the ranks' pipes, so a rank never
 * blocks on a pipe nobody reads. */
static int dest_broken[3];

/* Write all of iov to fd, across short writes, EINTR, and an fd someone set
 * non-blocking (then wait until it can take more). */
static void writev_all(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0 && !dest_broken[fd]) {
        ssize_t n = writev(fd, iov, cnt);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                (void)poll(&p, 1, -1);
                continue;
            }
            dest_broken[fd] = 1;
            return;
        }
        size_t done = (size_t)n;
        while (cnt > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
}

/* Write n bytes of the rank's output, prefixed if they start a line. */
static void emit(terse__run_stream *s, const char *p, size_t n) {
    struct iovec iov[2];
    int cnt = 0;
    if (s->at_line_start) iov[cnt++] = (struct iovec){s->prefix, s->prefix_len};
    iov[cnt++] = (struct iovec){(void *)p, n};
    writev_all(s->dest, iov, cnt);
}

void terse__run_stream_init(terse__run_stream *s, int fd, int dest, int rank) {
    s->fd = fd;
    s->dest = dest;
    s->at_line_start = 1;
    s->len = 0;
    int w = snprintf(s->prefix, sizeof s->prefix, "[%d] ", rank);
    s->prefix_len = w > 0 ? (size_t)w : 0;
}

size_t terse__run_stream_pump(terse__run_stream *s) {
    if (s->fd < 0) return 0;
    if (dest_broken[s->dest]) {
        /* Nobody reads our side any more: close the rank's pipe too, so its
         * next write fails (SIGPIPE) as it would in a plain shell pipeline. */
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) {
        /* End of file, or an error that means the same for us. */
        terse__run_stream_close(s);
        return 0;
    }
    s->len += (size_t)n;

    /* Step 1: write every complete line in the buffer. */
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf) + 1;
        emit(s, s->buf + start, end - start);
        s->at_line_start = 1;
        start = end;
    }
    /* Step 2: keep the unfinished tail for the next read... */
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    /* Step 3: ...unless it fills the buffer: then it goes out now, and the
     * rest of that line follows later without a prefix. */
    if (s->len == sizeof s->buf) {
        emit(s, s->buf, s->len);
        s->at_line_start = 0;
        s->len = 0;
    }
    return (size_t)n;
}

void terse__run_stream_close(terse__run_stream *s) {
    if (s->fd < 0) return;
    if (s->len > 0) {
        emit(s, s->buf, s->len);
        s->at_line_start = 0;
        s->len = 0;
    }
    if (!s->at_line_start) {
        struct iovec nl = {"\n", 1};
        writev_all(s->dest, &nl, 1);
        s->at_line_start = 1;
    }
    close(s->fd);
    s->fd = -1;
}
