/* Executes the commands buffered on a connection and composes the replies:
 * the memcached text protocol, as the core's callback table (main.c
 * registers it with conn_set_handler()). */
#ifndef KV_PROCESS_H
#define KV_PROCESS_H

#include "core/conn.h"

extern const struct conn_handler protocol_handler;

#endif
