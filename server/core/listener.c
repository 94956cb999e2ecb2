#include "core/listener.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/conn.h"
#include "core/ev.h"
#include "core/worker.h"

static int listen_fd = -1;
static int signal_fd = -1;

#define TOO_MANY "ERROR Too many open connections\r\n"

int listener_signals_setup(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return -1;
    signal(SIGPIPE, SIG_IGN);
    signal_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return signal_fd < 0 ? -1 : 0;
}

int listener_setup(const char *iface, int port, int *bound)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int err = getaddrinfo(iface, portstr, &hints, &res);
    if (err != 0) {
        fprintf(stderr, "kvcached: cannot resolve %s: %s\n", iface, gai_strerror(err));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        fprintf(stderr, "kvcached: cannot listen on %s:%d: %s\n", iface, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    listen_fd = fd;
    return fd;
}

static void accept_all(int maxconns)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fprintf(stderr, "kvcached: accept: %s\n", strerror(errno));
            return; /* EMFILE and friends: retry on the next readiness */
        }
        if (conns_current() >= (uint64_t)maxconns) {
            /* best effort: the socket is new, its buffer has room */
            ssize_t ignored = send(fd, TOO_MANY, sizeof(TOO_MANY) - 1, MSG_NOSIGNAL);
            (void)ignored;
            close(fd);
            conns_count_rejected();
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conns_count_open();
        if (workers_dispatch(fd) != 0) {
            close(fd);
            conns_count_closed_early();
        }
    }
}

int listener_run(int maxconns)
{
    ev_loop_t *loop = ev_create(4);
    int sig = 0;
    if (loop == NULL || ev_add(loop, listen_fd, EV_READ, &listen_fd) != 0 ||
        ev_add(loop, signal_fd, EV_READ, &signal_fd) != 0) {
        fprintf(stderr, "kvcached: cannot set up the accept loop\n");
        ev_destroy(loop);
        return -1;
    }
    while (sig == 0) {
        ev_fired_t *fired;
        int n = ev_wait(loop, -1, &fired);
        for (int i = 0; i < n; i++) {
            if (fired[i].data == &signal_fd) {
                struct signalfd_siginfo si;
                if (read(signal_fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                    sig = (int)si.ssi_signo;
            } else {
                accept_all(maxconns);
            }
        }
    }
    ev_destroy(loop);
    return sig;
}

void listener_teardown(void)
{
    if (listen_fd >= 0)
        close(listen_fd);
    if (signal_fd >= 0)
        close(signal_fd);
    listen_fd = signal_fd = -1;
}
