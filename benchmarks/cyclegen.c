/* cyclegen: lock cycles against a fencegate gateway, at little CPU per request.
 *
 * N keep-alive HTTP/1.1 connections on one epoll loop, one request in flight per
 * connection. Each connection does cycles on distinct names: POST
 * /v1/locks/bench/<tag>/<conn>/<n> {"ttl_ms": 10000}, and after a 200 DELETE of the
 * same name with the lease_id of the answer (X-Lease-Id). A name is kept from the
 * request, the lease_id found in the body with memmem: no allocation per request.
 *
 * When the duration is up no new cycle starts; the connections finish their last
 * request, a DELETE for every lease still held (bounded by a few seconds), then it
 * prints one line:
 *
 *   RESULT {"acquired": A, "released": R, "other": O, "codes": {"409": n, ...},
 *           "errors": E, "held": H, "requests": Q, "seconds": S, "p50_ms": .., "p99_ms": ..}
 *
 * acquired: POSTs answered 200; released: DELETEs answered 204; other: answers with
 * another status (by code in codes); errors: connections the gateway closed or reset
 * (each reconnects: a POST in flight is dropped, a DELETE sent again, so a release
 * that landed before the reset is answered 409) and requests still unanswered when the
 * drain ended; held: acquired - released; seconds: from the first request to the last
 * answer. Latency is per request, send to full answer, from a fixed log-linear
 * histogram (64 sub-buckets per power of two: within 1.6 %). A connect that fails, or
 * an answer it cannot parse, ends the run (exit 2, exit 1) without a RESULT line.
 *
 *   cyclegen -p PORT [-h 127.0.0.1] [-c 64] [-d 10] [-t TAG] [-l TTL_MS]
 *
 * Built by benchmarks/loadgen.py with `cc -O2` (Linux: epoll).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
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
#define REQ 1024
#define NAME 160
#define LEASE 64
#define SUB_BITS 6
#define SUB (1 << SUB_BITS)
#define BUCKETS 4096
#define MAX_CODES 32
#define DRAIN_NS 5000000000LL /* how long the last requests may take after the duration */

enum phase { IDLE, POSTING, DELETING };

struct conn {
    int fd;
    enum phase phase;
    int connected;
    uint64_t n;                /* cycles started on this connection */
    char name[NAME];           /* lock name of the cycle in progress */
    size_t name_len;
    char lease[LEASE];         /* its lease_id once acquired */
    size_t lease_len;
    char req[REQ];
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
static double duration = 10.0;
static const char *tag = "0";
static int ttl_ms = 10000;
static struct sockaddr_in addr;
static int ep;

static uint64_t acquired, released, other, errors, requests;
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

static void open_conn(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS)
        die("connect");
    c->connected = 0;
    c->buf_len = 0;
    c->head_len = 0;
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
}

static void want(struct conn *c, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
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

static void build_post(struct conn *c, int ci) {
    c->n++;
    char *e = put(c->name, post_head, post_head_len);
    e = put_u64(e, (uint64_t)ci);
    *e++ = '/';
    e = put_u64(e, c->n);
    c->name_len = (size_t)(e - c->name);
    e = put(c->req, "POST /v1/locks/", 15);
    e = put(e, c->name, c->name_len);
    e = put(e, post_tail, post_tail_len);
    c->req_len = (size_t)(e - c->req);
    c->phase = POSTING;
}

static void build_delete(struct conn *c) {
    char *e = put(c->req, "DELETE /v1/locks/", 17);
    e = put(e, c->name, c->name_len);
    e = put(e, del_tail, del_tail_len);
    e = put(e, c->lease, c->lease_len);
    e = put(e, "\r\n\r\n", 4);
    c->req_len = (size_t)(e - c->req);
    c->phase = DELETING;
}

/* Write what is left of the request; 0 when all of it is out, 1 to wait, -1 on error. */
static int send_req(struct conn *c) {
    if (c->req_sent == 0) {
        c->sent_ns = now_ns();
        if (!first_ns) first_ns = c->sent_ns;
    }
    while (c->req_sent < c->req_len) {
        /* MSG_NOSIGNAL: a connection the gateway closed is an error counted, not SIGPIPE */
        ssize_t w = send(c->fd, c->req + c->req_sent, c->req_len - c->req_sent, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN) return 1;
            return -1;
        }
        c->req_sent += (size_t)w;
    }
    return 0;
}

static void start_req(struct conn *c) {
    c->req_sent = 0;
    c->buf_len = 0;
    c->head_len = 0;
    int r = send_req(c);
    if (r == 1) want(c, EPOLLOUT);
    /* r < 0: the next read sees the error */
}

/* The length of the response in buf once it is whole (its status and the length of its
 * head and body are then in c), 0 while more is needed, -1 when it cannot be parsed.
 * from: how much of buf was there before the last read. */
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

static int find_lease(struct conn *c, const char *body, size_t blen) {
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
    c->lease_len = (size_t)(q - p);
    memcpy(c->lease, p, c->lease_len);
    return 0;
}

int main(int argc, char **argv) {
    int opt;
    while ((opt = getopt(argc, argv, "h:p:c:d:t:l:")) != -1) {
        switch (opt) {
        case 'h': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'c': nconn = atoi(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 't': tag = optarg; break;
        case 'l': ttl_ms = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s -p PORT [-h HOST] [-c CONNECTIONS] [-d SECONDS] [-t TAG] [-l TTL_MS]\n", argv[0]);
            return 2;
        }
    }
    if (port <= 0 || nconn <= 0 || duration <= 0) {
        fprintf(stderr, "cyclegen: -p PORT is required; -c and -d must be positive\n");
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
    for (int i = 0; i < nconn; i++) open_conn(&conns[i]);

    int64_t start = now_ns();
    int64_t stop = start + (int64_t)(duration * 1e9);
    int stopping = 0, busy = nconn;
    struct epoll_event events[256];
    while (busy > 0) {
        int64_t t = now_ns();
        if (!stopping && t >= stop) stopping = 1;
        if (stopping && t >= stop + DRAIN_NS) break;
        int timeout = (int)(((stopping ? stop + DRAIN_NS : stop) - t) / 1000000) + 1;
        int n = epoll_wait(ep, events, 256, timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            int ci = (int)(c - conns);
            if (!c->connected) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    errno = err;
                    die("connect");
                }
                c->connected = 1;
                want(c, EPOLLIN);
                if (c->phase == DELETING) build_delete(c); /* a lease to release after a reconnect */
                else if (stopping) { c->phase = IDLE; busy--; continue; }
                else build_post(c, ci);
                start_req(c);
                continue;
            }
            if (events[i].events & EPOLLOUT && c->req_sent < c->req_len) {
                int r = send_req(c);
                if (r == 0) want(c, EPOLLIN);
                if (r >= 0) continue;
            }
            ssize_t r = read(c->fd, c->buf + c->buf_len, BUF - c->buf_len);
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                /* closed or reset: the request in flight is lost; a POST's lock may be held
                 * (it expires with its ttl), a DELETE is tried again on a new connection */
                errors++;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                if (c->phase == POSTING) c->phase = IDLE;
                open_conn(c);
                continue;
            }
            if (r < 0) continue;
            size_t from = c->buf_len;
            c->buf_len += (size_t)r;
            ssize_t used = parse(c, from);
            if (used == 0) continue;
            int64_t done = now_ns();
            last_ns = done;
            requests++;
            int status = c->status;
            const char *body = c->buf + c->head_len;
            size_t blen = c->body_len;
            if (used < 0) {
                fprintf(stderr, "cyclegen: an answer it cannot parse: %.*s\n", (int)c->buf_len, c->buf);
                return 1;
            }
            uint64_t us = (uint64_t)((done - c->sent_ns) / 1000);
            hist[bucket(us)]++;
            hist_total++;
            if (c->phase == POSTING && status == 200) {
                if (find_lease(c, body, blen) < 0) {
                    fprintf(stderr, "cyclegen: no lease_id in %.*s\n", (int)blen, body);
                    return 1;
                }
                acquired++;
                build_delete(c);
                start_req(c);
                continue;
            }
            if (c->phase == DELETING && status == 204) released++;
            else {
                other++;
                count_code(status);
            }
            if (stopping) {
                c->phase = IDLE;
                busy--;
                continue;
            }
            build_post(c, ci);
            start_req(c);
        }
    }
    uint64_t held = acquired - released;
    for (int i = 0; i < nconn; i++)
        if (conns[i].phase != IDLE) errors++; /* still in flight when the drain ended */
    printf("RESULT {\"acquired\": %llu, \"released\": %llu, \"other\": %llu, \"codes\": {",
           (unsigned long long)acquired, (unsigned long long)released, (unsigned long long)other);
    for (int i = 0; i < ncodes; i++) printf("%s\"%d\": %d", i ? ", " : "", codes[i][0], codes[i][1]);
    printf("}, \"errors\": %llu, \"held\": %llu, \"requests\": %llu, \"seconds\": %.6f, "
           "\"p50_ms\": %.3f, \"p99_ms\": %.3f}\n",
           (unsigned long long)errors, (unsigned long long)held, (unsigned long long)requests,
           last_ns > first_ns ? (double)(last_ns - first_ns) / 1e9 : 0.0, percentile(50), percentile(99));
    return 0;
}
