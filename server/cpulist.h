/* CPU lists as taskset and the kernel write them: "0,2,4-7". Shared by
 * kvcached and kvload's --cpu-affinity, with the pinning of a thread. */
#ifndef KV_CPULIST_H
#define KV_CPULIST_H

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Parses `list` into cpus[] in the order given. Every CPU must be one this
 * process may run on. Returns how many, or -1 with a message in why[]. */
static inline int cpulist_parse(const char *list, int *cpus, int max, char *why, size_t whylen)
{
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        CPU_ZERO(&allowed);
    const char *p = list;
    int n = 0;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        if (errno == 0 && end != p && lo >= 0 && *end == '-') {
            const char *from = end + 1;
            hi = strtol(from, &end, 10);
            if (end == from)
                hi = -1;
        }
        if (errno != 0 || end == p || lo < 0 || hi < lo || (*end != ',' && *end != '\0') ||
            (*end == ',' && end[1] == '\0')) {
            snprintf(why, whylen, "wants CPU numbers and ranges like 0,2-3, not '%s'", list);
            return -1;
        }
        for (long cpu = lo; cpu <= hi; cpu++) {
            if (cpu >= CPU_SETSIZE || !CPU_ISSET((int)cpu, &allowed)) {
                snprintf(why, whylen, "names CPU %ld, which is not available to this process", cpu);
                return -1;
            }
            if (n == max) {
                snprintf(why, whylen, "lists more than %d CPUs", max);
                return -1;
            }
            cpus[n++] = (int)cpu;
        }
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0) {
        snprintf(why, whylen, "names no CPU: '%s'", list);
        return -1;
    }
    return n;
}

/* Pins the calling thread to `cpu`. When it cannot, says so on stderr as
 * "PROG: WHO: cannot pin to CPU n: why" and the thread runs unpinned. */
static inline void cpulist_pin_self(int cpu, const char *prog, const char *who)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    int err = pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    if (err != 0)
        fprintf(stderr, "%s: %s: cannot pin to CPU %d: %s\n", prog, who, cpu, strerror(err));
}

#endif
