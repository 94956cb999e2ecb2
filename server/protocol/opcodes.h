/* Request opcodes, numbered as documented in probes/kvs.d (cmd__* `opcode`)
 * and named as in `stats timings`. Append only: the numbers are a contract
 * with kvprof. */
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

const char *opcode_name(enum opcode op);

#endif
