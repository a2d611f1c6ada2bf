/* cyclegen: lock cycles against a fencegate gateway, at little CPU per request.
 *
 * N keep-alive HTTP/1.1 connections on one epoll loop. Each connection drives D lock
 * cycles at once (--depth D, default 1) on distinct names, HTTP/1.1 pipelined: it writes
 * D requests POST /v1/locks/bench/<tag>/<conn>/<n> {"ttl_ms": 10000} in one write, reads
 * the D answers (in order: HTTP/1.1 answers pipelined requests in order), then writes a
 * DELETE of each name answered 200, with its lease_id (X-Lease-Id), in one write, reads
 * those answers, and so on. With D = 1 that is one request in flight per connection. A
 * name is kept from the request, the lease_id found in the body with memmem: no
 * allocation per request.
 *
 * When the duration is up no new cycle starts; the connections finish the requests in
 * flight, a DELETE for every lease still held (bounded by a few seconds), then it prints
 * one line:
 *
 *   RESULT {"acquired": A, "released": R, "other": O, "codes": {"409": n, ...},
 *           "errors": E, "failed_connects": F, "unfinished": U, "lost": L, "resent": S,
 *           "held": H, "requests": Q, "depth": D, "syscalls": {"send": n, "read": n,
 *           "epoll_wait": n}, "seconds": S, "p50_ms": .., "p99_ms": ..}
 *
 * acquired: POSTs answered 200; released: DELETEs answered 204; other: answers with
 * another status (by code in codes); errors: connections the gateway closed or reset,
 * connects that failed (failed_connects of them: see below), and connections still
 * waiting for answers or to connect when the drain ended (unfinished of them); lost: POSTs whose connection broke before their answer (the gateway may have granted
 * the lock: it expires with its ttl); resent: DELETEs sent again on a new connection
 * after theirs broke (one that had landed is then answered 409); held: acquired -
 * released; syscalls: the sends, reads and epoll_waits it made (most of its CPU per
 * request is the kernel's, in these); seconds: from the first request to the last answer. Latency is per request,
 * from the write of its batch to its full answer, from a fixed log-linear histogram (64
 * sub-buckets per power of two: within 1.6 %).
 *
 * A connection that breaks is made again at once. One that breaks before its first
 * answer (a connect refused or reset, as while a killed worker's listening socket closes
 * or no worker listens) is counted in failed_connects and tried again after a backoff
 * (1 ms doubling up to 100 ms); after 200 such failures in a row, or 10 s of them, the
 * run ends (exit 2) without a RESULT line, as it does for an answer it cannot parse
 * (exit 1).
 *
 *   cyclegen -p PORT [-h 127.0.0.1] [-c 64] [-d 10] [-t TAG] [-l TTL_MS] [-D DEPTH]
 *
 * Built by benchmarks/loadgen.py with `cc -O2` (Linux: epoll).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF 16384
#define REQ 1024 /* room for one request */
#define NAME 160
#define LEASE 64
#define MAX_DEPTH 64
#define SUB_BITS 6
#define SUB (1 << SUB_BITS)
#define BUCKETS 4096
#define MAX_CODES 32
#define DRAIN_NS 5000000000LL /* how long the last requests may take after the duration */
#define MAX_FAILURES 200        /* connections broken before their first answer, in a row */
#define FAILING_NS 10000000000LL /* ... or for this long: the run ends */

enum state { CONNECTING, OPEN, WAITING, DONE }; /* WAITING: to connect again */
enum phase { IDLE, POSTING, DELETING };           /* what the requests in flight are */

struct slot { /* one of a connection's D cycles */
    char name[NAME];
    size_t name_len;
    char lease[LEASE]; /* once acquired */
    size_t lease_len;
    int held;          /* acquired, and no answer to its DELETE yet */
    int sent;          /* its DELETE was sent on a connection that broke */
};

struct conn {
    int fd;
    enum state state;
    enum phase phase;
    int answered;             /* an answer came on this connection */
    int failures;             /* connections broken before their first answer, in a row */
    int64_t failing_since, retry_at;
    uint64_t n;               /* cycles started on this connection */
    struct slot *slots;       /* depth of them */
    int batch[MAX_DEPTH];     /* the slots of the requests in flight, in order */
    int nbatch, nanswered;
    char *req;                /* the requests in flight, depth * REQ bytes */
    size_t req_len, req_sent;
    char buf[BUF];
    size_t buf_len;
    size_t head_len, body_len; /* of the response being read, once its head is whole */
    int status;
    int64_t sent_ns;
};

static const char *host = "127.0.0.1";
static int port = 0;
static int nconn = 64;
static int depth = 1;
static double duration = 10.0;
static const char *tag = "0";
static int ttl_ms = 10000;
static struct sockaddr_in addr;
static int ep;
static int stopping, busy, waiting; /* busy: connections not DONE; waiting: WAITING */

static uint64_t acquired, released, other, errors, failed, lost, resent, requests;
static uint64_t sends, reads, waits; /* system calls on the hot path */
static int codes[MAX_CODES][2]; /* status, count */
static int ncodes;
static uint64_t hist[BUCKETS];
static uint64_t hist_total;
static int64_t first_ns, last_ns;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int bucket(uint64_t us) {
    if (us < 2 * SUB) return (int)us;
    int top = 63 - __builtin_clzll(us);
    int shift = top - SUB_BITS;
    int idx = shift * SUB + (int)(us >> shift);
    return idx < BUCKETS ? idx : BUCKETS - 1;
}

static double bucket_value(int idx) { /* the middle of the bucket, in µs */
    if (idx < 2 * SUB) return idx;
    int shift = idx / SUB - 1;
    uint64_t low = (uint64_t)(idx - shift * SUB) << shift;
    return (double)low + (double)((1ULL << shift) - 1) / 2.0;
}

static double percentile(double p) {
    if (hist_total == 0) return 0.0;
    uint64_t want = (uint64_t)(p / 100.0 * (double)hist_total + 0.5);
    if (want < 1) want = 1;
    uint64_t seen = 0;
    for (int i = 0; i < BUCKETS; i++) {
        seen += hist[i];
        if (seen >= want) return bucket_value(i) / 1000.0;
    }
    return bucket_value(BUCKETS - 1) / 1000.0;
}

static void count_code(int status) {
    for (int i = 0; i < ncodes; i++)
        if (codes[i][0] == status) {
            codes[i][1]++;
            return;
        }
    if (ncodes < MAX_CODES) {
        codes[ncodes][0] = status;
        codes[ncodes][1] = 1;
        ncodes++;
    }
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void want(struct conn *c, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
}

static void close_conn(struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
}

static void finish(struct conn *c) {
    if (c->fd >= 0) close_conn(c);
    c->state = DONE;
    c->phase = IDLE;
    busy--;
}

static void broken(struct conn *c, int err);

static int holds_leases(const struct conn *c) {
    for (int s = 0; s < depth; s++)
        if (c->slots[s].held) return 1;
    return 0;
}

static void open_conn(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = CONNECTING;
    c->answered = 0;
    c->buf_len = 0;
    c->head_len = 0;
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS)
        broken(c, errno);
}

/* The connection broke (closed, reset, or never made): count it and what was in flight
 * on it, and connect again: at once if it had answered, else after a backoff. */
static void broken(struct conn *c, int err) {
    errors++;
    if (c->phase == POSTING) lost += (uint64_t)(c->nbatch - c->nanswered);
    /* a DELETE in flight: its slot is still held, and sent again on the next connection */
    c->phase = IDLE;
    close_conn(c);
    int64_t t = now_ns();
    if (c->answered) {
        c->failures = 0;
    } else {
        failed++;
        if (c->failures++ == 0) c->failing_since = t;
        if (c->failures > MAX_FAILURES || t - c->failing_since > FAILING_NS) {
            errno = err;
            die("cyclegen: connecting again failed too often");
        }
    }
    if (stopping && !holds_leases(c)) {
        finish(c);
        return;
    }
    if (c->failures == 0) {
        open_conn(c);
        return;
    }
    int shift = c->failures - 1 < 7 ? c->failures - 1 : 7;
    int64_t backoff = 1000000LL << shift;
    c->retry_at = t + (backoff < 100000000LL ? backoff : 100000000LL);
    c->state = WAITING;
    waiting++;
}

/* The fixed parts of the requests, built once: a request is then a few memcpy. */
static char post_head[NAME], post_tail[REQ / 2], del_tail[REQ / 4];
static size_t post_head_len, post_tail_len, del_tail_len;

static void build_parts(void) {
    char body[64];
    int blen = snprintf(body, sizeof body, "{\"ttl_ms\": %d}", ttl_ms);
    post_head_len = (size_t)snprintf(post_head, sizeof post_head, "bench/%s/", tag);
    post_tail_len = (size_t)snprintf(post_tail, sizeof post_tail,
                                     " HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                                     "Content-Length: %d\r\n\r\n%s",
                                     host, port, blen, body);
    del_tail_len = (size_t)snprintf(del_tail, sizeof del_tail, " HTTP/1.1\r\nHost: %s:%d\r\nX-Lease-Id: ",
                                    host, port);
    if (post_head_len >= sizeof post_head - 48 || post_tail_len >= sizeof post_tail - 1 ||
        del_tail_len >= sizeof del_tail - 1) {
        fprintf(stderr, "cyclegen: -t or -h too long\n");
        exit(2);
    }
}

static char *put(char *to, const char *from, size_t n) {
    memcpy(to, from, n);
    return to + n;
}

static char *put_u64(char *to, uint64_t v) {
    char digits[24];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n) *to++ = digits[--n];
    return to;
}

/* Append a POST of a new name for slot s to the requests to send. */
static void add_post(struct conn *c, int ci, int s) {
    struct slot *sl = &c->slots[s];
    c->n++;
    char *e = put(sl->name, post_head, post_head_len);
    e = put_u64(e, (uint64_t)ci);
    *e++ = '/';
    e = put_u64(e, c->n);
    sl->name_len = (size_t)(e - sl->name);
    e = put(c->req + c->req_len, "POST /v1/locks/", 15);
    e = put(e, sl->name, sl->name_len);
    e = put(e, post_tail, post_tail_len);
    c->req_len = (size_t)(e - c->req);
    c->batch[c->nbatch++] = s;
}

/* Append a DELETE of slot s's lease. */
static void add_delete(struct conn *c, int s) {
    struct slot *sl = &c->slots[s];
    if (sl->sent) resent++;
    sl->sent = 1;
    char *e = put(c->req + c->req_len, "DELETE /v1/locks/", 17);
    e = put(e, sl->name, sl->name_len);
    e = put(e, del_tail, del_tail_len);
    e = put(e, sl->lease, sl->lease_len);
    e = put(e, "\r\n\r\n", 4);
    c->req_len = (size_t)(e - c->req);
    c->batch[c->nbatch++] = s;
}

/* Write what is left of the requests; 0 when all of it is out, 1 to wait, -1 on error. */
static int send_req(struct conn *c) {
    if (c->req_sent == 0) {
        c->sent_ns = now_ns();
        if (!first_ns) first_ns = c->sent_ns;
    }
    while (c->req_sent < c->req_len) {
        /* MSG_NOSIGNAL: a connection the gateway closed is an error counted, not SIGPIPE */
        sends++;
        ssize_t w = send(c->fd, c->req + c->req_sent, c->req_len - c->req_sent, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN) return 1;
            return -1;
        }
        c->req_sent += (size_t)w;
    }
    return 0;
}

/* The next requests on an open connection with none in flight, in one write: the
 * DELETEs of the leases its slots hold, else D POSTs; nothing once the duration is up. */
static void next_batch(struct conn *c, int ci) {
    c->req_len = c->req_sent = 0;
    c->nbatch = c->nanswered = 0;
    for (int s = 0; s < depth; s++)
        if (c->slots[s].held) add_delete(c, s);
    if (c->nbatch) {
        c->phase = DELETING;
    } else if (stopping) {
        finish(c);
        return;
    } else {
        for (int s = 0; s < depth; s++) add_post(c, ci, s);
        c->phase = POSTING;
    }
    int r = send_req(c);
    if (r == 1) want(c, EPOLLIN | EPOLLOUT); /* answers may come while the rest waits */
    else if (r < 0) broken(c, errno);
}

/* The length of the response at the start of buf once it is whole (its status and the
 * length of its head and body are then in c), 0 while more is needed, -1 when it cannot
 * be parsed. from: how much of buf was already searched for the end of the head. */
static ssize_t parse(struct conn *c, size_t from) {
    if (!c->head_len) {
        /* the blank line ending the head: a \n after \r\n\r (it may straddle two reads) */
        char *end = NULL, *limit = c->buf + c->buf_len;
        for (char *nl = c->buf + (from > 3 ? from : 3); nl < limit; nl++) {
            nl = memchr(nl, '\n', (size_t)(limit - nl));
            if (!nl) break;
            if (nl - c->buf >= 3 && memcmp(nl - 3, "\r\n\r", 3) == 0) {
                end = nl - 3;
                break;
            }
        }
        if (!end) return c->buf_len >= BUF ? -1 : 0;
        if (c->buf_len < 12 || memcmp(c->buf, "HTTP/1.", 7) != 0) return -1;
        c->status = atoi(c->buf + 9);
        c->head_len = (size_t)(end - c->buf) + 4;
        c->body_len = 0;
        for (char *line = memchr(c->buf, '\n', c->head_len); line && line < end;
             line = memchr(line, '\n', (size_t)(end - line))) {
            line++;
            if (strncasecmp(line, "content-length:", 15) == 0)
                c->body_len = strtoul(line + 15, NULL, 10);
            else if (strncasecmp(line, "transfer-encoding:", 18) == 0)
                return -1; /* aiohttp's json_response and 204 never chunk */
        }
        if (c->head_len + c->body_len > BUF) return -1;
    }
    if (c->buf_len < c->head_len + c->body_len) return 0;
    return (ssize_t)(c->head_len + c->body_len);
}

static int find_lease(struct slot *sl, const char *body, size_t blen) {
    const char key[] = "\"lease_id\"";
    const char *p = memmem(body, blen, key, sizeof key - 1);
    if (!p) return -1;
    const char *end = body + blen;
    p += sizeof key - 1;
    while (p < end && (*p == ' ' || *p == ':')) p++;
    if (p >= end || *p != '"') return -1;
    p++;
    const char *q = memchr(p, '"', (size_t)(end - p));
    if (!q || q - p >= LEASE) return -1;
    sl->lease_len = (size_t)(q - p);
    memcpy(sl->lease, p, sl->lease_len);
    return 0;
}

/* The whole answer at the start of buf is to the next request of the batch. */
static void answer(struct conn *c, const char *body, size_t blen) {
    struct slot *sl = &c->slots[c->batch[c->nanswered++]];
    int64_t done = now_ns();
    last_ns = done;
    requests++;
    hist[bucket((uint64_t)((done - c->sent_ns) / 1000))]++;
    hist_total++;
    c->answered = 1;
    if (c->phase == POSTING && c->status == 200) {
        if (find_lease(sl, body, blen) < 0) {
            fprintf(stderr, "cyclegen: no lease_id in %.*s\n", (int)blen, body);
            exit(1);
        }
        acquired++;
        sl->held = 1;
        sl->sent = 0;
        return;
    }
    if (c->phase == DELETING) {
        sl->held = 0; /* 204, or given up: a 409 says it is no longer held */
        if (c->status == 204) {
            released++;
            return;
        }
    }
    other++;
    count_code(c->status);
}

/* Read what came; handle each whole answer. */
static void receive(struct conn *c, int ci) {
    reads++;
    ssize_t r = read(c->fd, c->buf + c->buf_len, BUF - c->buf_len);
    if (r == 0 || (r < 0 && errno != EAGAIN)) {
        broken(c, r == 0 ? ECONNRESET : errno);
        return;
    }
    if (r < 0) return;
    size_t from = c->buf_len;
    c->buf_len += (size_t)r;
    for (;;) {
        ssize_t used = parse(c, from);
        if (used == 0) return;
        if (used < 0 || c->nanswered >= c->nbatch) {
            fprintf(stderr, "cyclegen: an answer it %s: %.*s\n",
                    used < 0 ? "cannot parse" : "did not ask for", (int)c->buf_len, c->buf);
            exit(1);
        }
        answer(c, c->buf + c->head_len, c->body_len);
        c->buf_len -= (size_t)used;
        memmove(c->buf, c->buf + used, c->buf_len);
        c->head_len = 0;
        from = 0;
        if (c->nanswered == c->nbatch) {
            if (c->buf_len) {
                fprintf(stderr, "cyclegen: an answer it did not ask for: %.*s\n", (int)c->buf_len,
                        c->buf);
                exit(1);
            }
            next_batch(c, ci);
            return;
        }
    }
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s -p PORT [-h HOST] [-c CONNECTIONS] [-d SECONDS] [-t TAG] [-l TTL_MS] "
            "[-D|--depth DEPTH]\n",
            argv0);
    exit(2);
}

int main(int argc, char **argv) {
    static const struct option longs[] = {{"depth", required_argument, NULL, 'D'}, {0, 0, 0, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "h:p:c:d:t:l:D:", longs, NULL)) != -1) {
        switch (opt) {
        case 'h': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'c': nconn = atoi(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 't': tag = optarg; break;
        case 'l': ttl_ms = atoi(optarg); break;
        case 'D': depth = atoi(optarg); break;
        default: usage(argv[0]);
        }
    }
    if (optind < argc) usage(argv[0]);
    if (port <= 0 || nconn <= 0 || duration <= 0 || depth < 1 || depth > MAX_DEPTH) {
        fprintf(stderr, "cyclegen: -p PORT is required; -c and -d must be positive, "
                        "--depth 1 to %d\n", MAX_DEPTH);
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "cyclegen: -h %s: an IPv4 address\n", host);
        return 2;
    }
    build_parts();
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    struct conn *conns = calloc((size_t)nconn, sizeof *conns);
    if (!conns) die("calloc");
    busy = nconn;
    for (int i = 0; i < nconn; i++) {
        conns[i].slots = calloc((size_t)depth, sizeof *conns[i].slots);
        conns[i].req = malloc((size_t)depth * REQ);
        if (!conns[i].slots || !conns[i].req) die("calloc");
        open_conn(&conns[i]);
    }

    int64_t start = now_ns();
    int64_t stop = start + (int64_t)(duration * 1e9);
    struct epoll_event events[256];
    while (busy > 0) {
        int64_t t = now_ns();
        if (!stopping && t >= stop) stopping = 1;
        if (stopping && t >= stop + DRAIN_NS) break;
        int64_t wake = stopping ? stop + DRAIN_NS : stop;
        for (int i = 0; waiting && i < nconn; i++) { /* connections to make again */
            struct conn *c = &conns[i];
            if (c->state != WAITING) continue;
            if (stopping && !holds_leases(c)) { /* nothing left to do on it */
                waiting--;
                finish(c);
            } else if (c->retry_at <= t) {
                waiting--;
                open_conn(c);
            } else if (c->retry_at < wake) {
                wake = c->retry_at;
            }
        }
        waits++;
        int n = epoll_wait(ep, events, 256, (int)((wake - t) / 1000000) + 1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            int ci = (int)(c - conns);
            if (c->state != CONNECTING && c->state != OPEN) continue; /* broken by an earlier event */
            if (c->state == CONNECTING) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    broken(c, err);
                    continue;
                }
                c->state = OPEN;
                want(c, EPOLLIN);
                next_batch(c, ci);
                continue;
            }
            if (events[i].events & EPOLLOUT && c->req_sent < c->req_len) {
                int r = send_req(c);
                if (r < 0) {
                    broken(c, errno);
                    continue;
                }
                if (r == 0) want(c, EPOLLIN);
            }
            if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) receive(c, ci);
        }
    }
    uint64_t held = acquired - released, unfinished = 0;
    for (int i = 0; i < nconn; i++)
        if (conns[i].state != DONE) unfinished++; /* still in flight when the drain ended */
    errors += unfinished;
    printf("RESULT {\"acquired\": %llu, \"released\": %llu, \"other\": %llu, \"codes\": {",
           (unsigned long long)acquired, (unsigned long long)released, (unsigned long long)other);
    for (int i = 0; i < ncodes; i++) printf("%s\"%d\": %d", i ? ", " : "", codes[i][0], codes[i][1]);
    printf("}, \"errors\": %llu, \"failed_connects\": %llu, \"unfinished\": %llu, \"lost\": %llu, "
           "\"resent\": %llu, \"held\": %llu, \"requests\": %llu, \"depth\": %d, "
           "\"syscalls\": {\"send\": %llu, \"read\": %llu, \"epoll_wait\": %llu}, \"seconds\": %.6f, "
           "\"p50_ms\": %.3f, \"p99_ms\": %.3f}\n",
           (unsigned long long)errors, (unsigned long long)failed, (unsigned long long)unfinished,
           (unsigned long long)lost, (unsigned long long)resent,
           (unsigned long long)held, (unsigned long long)requests, depth, (unsigned long long)sends,
           (unsigned long long)reads, (unsigned long long)waits,
           last_ns > first_ns ? (double)(last_ns - first_ns) / 1e9 : 0.0, percentile(50), percentile(99));
    return 0;
}
