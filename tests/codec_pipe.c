/* codec_pipe: the C side of python/tests/test_codec.py. Reads rows*cols
 * fp32 values (little endian, raw) from stdin, creates the codec from the
 * spec, sets its stream to (tensor, rank), encodes `steps` times (each
 * encode of the same input, so error feedback and streams move on), and
 * writes every message to stdout, each preceded by its length as a
 * little-endian uint64, then the decode of the last message as raw fp32.
 *
 *   codec_pipe SPEC ROWS COLS TENSOR RANK STEPS < floats > messages
 *
 * `codec_pipe --abi` prints the size and every field's offset of the
 * public structs, one "struct field offset" line each ("struct - size"),
 * for the ctypes declarations to be checked against.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "terse.h"

static int fail(const char *what, terse_status st)
{
    fprintf(stderr, "codec_pipe: %s: %s: %s\n", what, terse_status_name(st), terse_last_error());
    return 1;
}

#define SZ(T) printf("%s - %zu\n", #T, sizeof(T))
#define OFF(T, f) printf("%s %s %zu\n", #T, #f, offsetof(T, f))

static int abi(void)
{
    SZ(terse_comm_config);
    OFF(terse_comm_config, size); OFF(terse_comm_config, rank); OFF(terse_comm_config, nranks);
    OFF(terse_comm_config, addr); OFF(terse_comm_config, provider);
    OFF(terse_comm_config, token); OFF(terse_comm_config, timeout_ms);
    OFF(terse_comm_config, init_timeout_ms); OFF(terse_comm_config, rejoin);
    SZ(terse_comm_stats);
    OFF(terse_comm_stats, size); OFF(terse_comm_stats, ops);
    OFF(terse_comm_stats, payload_bytes_sent); OFF(terse_comm_stats, payload_bytes_recv);
    OFF(terse_comm_stats, wire_bytes_sent); OFF(terse_comm_stats, wire_bytes_recv);
    OFF(terse_comm_stats, codec_seconds); OFF(terse_comm_stats, network_seconds);
    OFF(terse_comm_stats, auth_failures); OFF(terse_comm_stats, stranger_drops);
    OFF(terse_comm_stats, control_bytes_sent); OFF(terse_comm_stats, control_bytes_recv);
    SZ(terse_codec_traits);
    OFF(terse_codec_traits, size); OFF(terse_codec_traits, id); OFF(terse_codec_traits, name);
    OFF(terse_codec_traits, summable); OFF(terse_codec_traits, error_feedback);
    OFF(terse_codec_traits, randomized); OFF(terse_codec_traits, bits_per_element);
    OFF(terse_codec_traits, fixed_size); OFF(terse_codec_traits, segment_align);
    OFF(terse_codec_traits, segment_options);
    SZ(terse_wire_info);
    OFF(terse_wire_info, codec_id); OFF(terse_wire_info, count);
    OFF(terse_wire_info, payload_len);
    SZ(terse_ps_config);
    OFF(terse_ps_config, size); OFF(terse_ps_config, num_servers);
    OFF(terse_ps_config, chunk_bytes); OFF(terse_ps_config, vnodes); OFF(terse_ps_config, mode);
    OFF(terse_ps_config, quorum); OFF(terse_ps_config, staleness);
    OFF(terse_ps_config, max_staleness); OFF(terse_ps_config, lr_scale);
    OFF(terse_ps_config, update); OFF(terse_ps_config, lr); OFF(terse_ps_config, momentum);
    OFF(terse_ps_config, aggregator); OFF(terse_ps_config, deadline_ms);
    OFF(terse_ps_config, replicas);
    OFF(terse_ps_config, partition_bytes);
    OFF(terse_ps_config, window);
    OFF(terse_ps_config, colocate);
    OFF(terse_ps_config, stale_rule); OFF(terse_ps_config, dc_lambda);
    OFF(terse_ps_config, lr_schedule); OFF(terse_ps_config, lr_steps);
    OFF(terse_ps_config, lr_warmup);
    SZ(terse_ps_stats);
    OFF(terse_ps_stats, size); OFF(terse_ps_stats, pushes); OFF(terse_ps_stats, pulls);
    OFF(terse_ps_stats, stale_refused); OFF(terse_ps_stats, pushes_applied);
    OFF(terse_ps_stats, steps_closed); OFF(terse_ps_stats, late_dropped);
    OFF(terse_ps_stats, refused_stale); OFF(terse_ps_stats, refused_key);
    OFF(terse_ps_stats, refused_step); OFF(terse_ps_stats, refused_role);
    OFF(terse_ps_stats, refused_corrupt); OFF(terse_ps_stats, staleness_max);
    OFF(terse_ps_stats, staleness_mean); OFF(terse_ps_stats, workers_lost);
    OFF(terse_ps_stats, refused_nonfinite); OFF(terse_ps_stats, deadline_closes);
    OFF(terse_ps_stats, replicated); OFF(terse_ps_stats, takeovers); OFF(terse_ps_stats, duplicates);
    OFF(terse_ps_stats, dc_copy_bytes); OFF(terse_ps_stats, refused_window);
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--abi") == 0)
        return abi();
    if (argc != 7 || strcmp(argv[1], "--help") == 0) {
        fprintf(stderr, "usage: codec_pipe SPEC ROWS COLS TENSOR RANK STEPS < floats > messages\n"
                        "       codec_pipe --abi\n");
        return argc == 2 ? 0 : 2;
    }
    size_t rows = strtoull(argv[2], NULL, 10), cols = strtoull(argv[3], NULL, 10);
    uint64_t tensor = strtoull(argv[4], NULL, 10);
    uint32_t rank = (uint32_t)strtoul(argv[5], NULL, 10);
    int steps = atoi(argv[6]);
    terse_codec *c = NULL;
    terse_status st = terse_codec_create(argv[1], rows, cols, &c);
    if (st != TERSE_OK)
        return fail("create", st);
    if ((st = terse_codec_set_stream(c, tensor, rank)) != TERSE_OK)
        return fail("set_stream", st);
    size_t n = rows * cols, cap = terse_codec_bound(c), len = 0;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    unsigned char *msg = malloc(cap);
    if (!x || !y || !msg || fread(x, sizeof *x, n, stdin) != n) {
        fprintf(stderr, "codec_pipe: expected %zu floats on stdin\n", n);
        return 1;
    }
    for (int s = 0; s < steps; s++) {
        if ((st = terse_encode(c, x, msg, cap, &len)) != TERSE_OK)
            return fail("encode", st);
        uint64_t l = len;
        fwrite(&l, sizeof l, 1, stdout);
        fwrite(msg, 1, len, stdout);
    }
    if ((st = terse_decode(c, msg, len, y, 1.0f, 0)) != TERSE_OK)
        return fail("decode", st);
    fwrite(y, sizeof *y, n, stdout);
    free(x);
    free(y);
    free(msg);
    terse_codec_free(c);
    return fflush(stdout) == 0 ? 0 : 1;
}
