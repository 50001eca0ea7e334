/* The loopback port of a rank's data endpoint (tcp;ofi_rxm), read from the
 * endpoint name it publishes: what a process on the same machine would find
 * with `ss -ltn`. For the tests that attack or cut a rank's connections. */
#ifndef TERSE_TESTS_ENDPOINT_PORT_H
#define TERSE_TESTS_ENDPOINT_PORT_H

#include <arpa/inet.h>
#include <string.h>

#include "algos/comm/comm.h"

/* 0 when the name cannot be read. */
static inline int endpoint_port(terse_comm *c) {
    uint8_t name[256];
    size_t len = sizeof name;
    if (terse__fabric_name(c->fabric, name, &len) != TERSE_OK) return 0;
    uint16_t port;
    memcpy(&port, name + 48 + 2, 2); /* the sockaddr_in after the blob's header */
    return ntohs(port);
}

#endif
