/* The listening socket and the main thread's loop: accept, enforce -c,
 * hand connections to workers; return on SIGTERM or SIGINT. */
#ifndef KV_LISTENER_H
#define KV_LISTENER_H

/* Blocks SIGTERM/SIGINT (they are read from a signalfd) and ignores
 * SIGPIPE; call before any thread starts so every thread inherits it. */
int listener_signals_setup(void);
/* Binds iface:port (port 0: any free one); returns the socket and stores
 * the port it got in *bound, or -1 with the reason printed. */
int listener_setup(const char *iface, int port, int *bound);
/* Accepts until a shutdown signal arrives; returns the signal number. */
int listener_run(int maxconns);
void listener_teardown(void);

#endif
