/* Request opcodes, numbered as documented in kvprof/probes/kvs.d (cmd__* `opcode`)
 * and named as in `stats timings`. Append only: the numbers are a contract
 * with kvprof, which reads the names from this file
 * (kvprof.collect.requests.opcode_names, checked by tests/test_contracts.py).
 * Below every layer: the protocol parses and runs them, stats/ times them. */
#ifndef KV_OPCODES_H
#define KV_OPCODES_H

#define KV_OPCODES(X)                                                          \
    X(GET, "get")                                                              \
    X(GETS, "gets")                                                            \
    X(GAT, "gat")                                                              \
    X(GATS, "gats")                                                            \
    X(SET, "set")                                                              \
    X(ADD, "add")                                                              \
    X(REPLACE, "replace")                                                      \
    X(APPEND, "append")                                                        \
    X(PREPEND, "prepend")                                                      \
    X(CAS, "cas")                                                              \
    X(DELETE, "delete")                                                        \
    X(INCR, "incr")                                                            \
    X(DECR, "decr")                                                            \
    X(TOUCH, "touch")                                                          \
    X(FLUSH_ALL, "flush_all")

enum opcode {
#define X(id, name) OP_##id,
    KV_OPCODES(X)
#undef X
    OPS_MAX
};

/* cmd__done `status` */
enum op_status { OPS_OK = 0, OPS_MISS = 1, OPS_EXISTS = 2, OPS_NOT_STORED = 3, OPS_ERROR = 4 };

static inline const char *opcode_name(enum opcode op)
{
    static const char *const names[OPS_MAX] = {
#define X(id, name) [OP_##id] = name,
        KV_OPCODES(X)
#undef X
    };
    return names[op];
}

#endif
