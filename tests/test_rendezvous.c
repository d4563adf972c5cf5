/* Tests of llmc/parallel/rendezvous.h with real processes: ranks share a blob over
 * tcp:// on the loopback and over file: in a temporary directory; timeouts,
 * world-size mismatches, duplicate ranks, strangers on the port, bad specs
 * and MASTER_ADDR/MASTER_PORT. Each rank runs in its own forked process. */
#include "llmc/parallel/rendezvous.h"
#include "tests/fake_env.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define BLOB 128 /* sizeof(ncclUniqueId) */

static int passed = 0, failed = 0;

static void check(int ok, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
    fflush(stdout);
    ok ? passed++ : failed++;
}

/* Rank 0's blob: differs per test, so a blob from an earlier test is noticed. */
static void fill(unsigned char *b, unsigned seed)
{
    for (int i = 0; i < BLOB; i++)
        b[i] = (unsigned char)(seed * 131u + (unsigned)i * 7u + 1u);
}

typedef struct {
    int rank, world;
    double timeout_s;
    double delay_s;           /* before the call, to start ranks out of order */
    const char *expect_error; /* NULL: must succeed with rank 0's blob; else a part of the message */
    double min_s, max_s;      /* when expect_error: how long the failure may take */
    int stranger;             /* not a rank: connects to the port and sends junk */
} Rank;

/* A connection that does not speak the protocol, as a port scanner would make. */
static int stranger(const char *spec)
{
    RendezvousSpec_ s;
    char why[256];
    if (rendezvous_parse_(spec, &s, why, sizeof(why)) != 0)
        return 1;
    double deadline = rendezvous_now_() + 5.0;
    int fd;
    while ((fd = rendezvous_connect_(&s, deadline, why, sizeof(why))) < 0 && rendezvous_ms_left_(deadline) > 0)
        rendezvous_sleep_(0.02, deadline);
    if (fd < 0)
        return 1;
    char junk[RENDEZVOUS_HEADER_BYTES] = "GET / HTTP/1.0\r\n\r\n";
    int rc = rendezvous_io_(fd, junk, sizeof(junk), 1, deadline, why, sizeof(why));
    rendezvous_close_(fd);
    return rc != 0;
}

/* One rank, in its own process: 0 if it did what the test expects. */
static int run_rank(const char *spec, const Rank *r, unsigned seed)
{
    alarm(15); /* a hang must not hang the test */
    rendezvous_sleep_(r->delay_s, rendezvous_now_() + r->delay_s);
    if (r->stranger)
        return stranger(spec);
    unsigned char blob[BLOB], want[BLOB];
    fill(want, seed);
    if (r->rank == 0)
        memcpy(blob, want, BLOB);
    else
        memset(blob, 0xee, BLOB);
    char err[1024] = "";
    double t0 = rendezvous_now_();
    int rc = rendezvous_share(spec, r->rank, r->world, blob, BLOB, r->timeout_s, err, sizeof(err));
    double dt = rendezvous_now_() - t0;
    int ok = r->expect_error ? rc == -1 && strstr(err, r->expect_error) != NULL && dt >= r->min_s && dt <= r->max_s
                             : rc == 0 && memcmp(blob, want, BLOB) == 0;
    if (!ok || r->expect_error)
        printf("    %s rank %d of %d: rc %d after %.2f s%s, '%s'%s%s\n", ok ? "ok" : "WRONG", r->rank, r->world, rc, dt,
               rc == 0 && memcmp(blob, want, BLOB) != 0 ? ", wrong blob" : "", err,
               r->expect_error ? ", wanted a message with " : "", r->expect_error ? r->expect_error : "");
    fflush(stdout);
    return !ok;
}

typedef struct {
    const char *what;
    char spec[512];
    pid_t pids[16];
    int n, bad;
} Batch;

/* Starts every rank as a process, each after its delay. */
static void start_ranks(Batch *b, const char *what, const char *spec, const Rank *ranks, int n, unsigned seed)
{
    b->what = what;
    snprintf(b->spec, sizeof(b->spec), "%s", spec);
    b->n = n;
    b->bad = 0;
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        b->pids[i] = fork();
        if (b->pids[i] == 0)
            _exit(run_rank(spec, &ranks[i], seed));
        if (b->pids[i] < 0) {
            perror("fork");
            b->bad++;
        }
    }
}

/* Waits for them: PASS if all behaved. */
static void finish_ranks(Batch *b)
{
    for (int i = 0; i < b->n; i++) {
        int st = 0;
        if (b->pids[i] < 0)
            continue;
        while (waitpid(b->pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            b->bad++;
    }
    char detail[600];
    snprintf(detail, sizeof(detail), "%s, %d processes, %d misbehaved", b->spec, b->n, b->bad);
    check(b->bad == 0, b->what, detail);
}

static void run_ranks(const char *what, const char *spec, const Rank *ranks, int n, unsigned seed)
{
    Batch b;
    start_ranks(&b, what, spec, ranks, n, seed);
    finish_ranks(&b);
}

/* A port nothing listens on now: the kernel's pick for port 0. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free_port");
        exit(2);
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void tcp_spec(char *spec, size_t len, const char *host)
{
    snprintf(spec, len, "tcp://%s:%d", host, free_port());
}

static int have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Rank 0 of a file: rendezvous, run here: it does not wait for the readers. */
static int file_rank0(const char *spec, int world, unsigned seed, char *err, size_t errlen)
{
    unsigned char blob[BLOB];
    fill(blob, seed);
    return rendezvous_share(spec, 0, world, blob, BLOB, 5.0, err, errlen);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static void test_tcp(void)
{
    char spec[512];
    unsigned char blob[BLOB], want[BLOB];
    char err[1024] = "";

    /* World 1: nothing to share, no port opened. */
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    fill(want, 1);
    memcpy(blob, want, BLOB);
    int rc = rendezvous_share(spec, 0, 1, blob, BLOB, 1.0, err, sizeof(err));
    check(rc == 0 && memcmp(blob, want, BLOB) == 0, "tcp world 1", err);

    /* Rank 1 starts before rank 0 and retries until it listens. */
    Rank two[] = {{0, 2, 5, 0.2, NULL, 0, 0, 0}, {1, 2, 5, 0, NULL, 0, 0, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    run_ranks("tcp world 2, rank 1 first", spec, two, 2, 2);

    Rank five[] = {{3, 5, 5, 0, NULL, 0, 0, 0},
                   {0, 5, 5, 0.1, NULL, 0, 0, 0},
                   {4, 5, 5, 0.05, NULL, 0, 0, 0},
                   {1, 5, 5, 0.3, NULL, 0, 0, 0},
                   {2, 5, 5, 0.15, NULL, 0, 0, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    run_ranks("tcp world 5, ranks in mixed order", spec, five, 5, 3);

    Rank three[] = {{0, 3, 5, 0, NULL, 0, 0, 0}, {1, 3, 5, 0, NULL, 0, 0, 0}, {2, 3, 5, 0, NULL, 0, 0, 0}};
    tcp_spec(spec, sizeof(spec), "localhost");
    run_ranks("tcp world 3 through a host name (getaddrinfo)", spec, three, 3, 4);

    if (have_ipv6_loopback()) {
        tcp_spec(spec, sizeof(spec), "[::1]");
        run_ranks("tcp world 2 over IPv6 [::1]", spec, two, 2, 5);
    } else {
        printf("SKIP tcp over IPv6: no ::1 on this host\n");
    }

    Rank with_stranger[] = {{0, 2, 5, 0, NULL, 0, 0, 0}, {0, 0, 0, 0.05, NULL, 0, 0, 1}, {1, 2, 5, 0.3, NULL, 0, 0, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    run_ranks("tcp: a stranger's connection is dropped, the run goes on", spec, with_stranger, 3, 6);

    Rank mismatch[] = {{0, 2, 5, 0, "a world of 3, but this run has 2", 0, 1.5, 0},
                       {1, 3, 5, 0, "runs a world of 2 processes, but this one was started with 3", 0, 1.5, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    run_ranks("tcp: world-size mismatch fails both sides at once", spec, mismatch, 2, 9);

    Rank dup[] = {{0, 3, 5, 0, "as rank 1 twice", 0, 1.5, 0},
                  {1, 3, 5, 0, "rank 0 at tcp://", 0, 1.5, 0},
                  {1, 3, 5, 0.2, "rank 0 at tcp://", 0, 1.5, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    run_ranks("tcp: a rank that checks in twice fails the run", spec, dup, 3, 10);

    /* The port is taken by a listener: rank 0 says so instead of waiting. */
    int port = free_port(), one = 1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons((uint16_t)port);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 1) != 0) {
        perror("busy port");
        exit(2);
    }
    snprintf(spec, sizeof(spec), "tcp://127.0.0.1:%d", port);
    fill(blob, 11);
    rc = rendezvous_share(spec, 0, 2, blob, BLOB, 1.0, err, sizeof(err));
    check(rc == -1 && strstr(err, "could not listen on port") && strstr(err, "in use"), "tcp: port in use", err);
    close(fd);
}

static void test_file(void)
{
    char dir[] = "/tmp/test_rendezvous_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    char spec[512], path[400], err[1024] = "";

    /* Readers first: they poll until rank 0's file appears. */
    snprintf(path, sizeof(path), "%s/id-job1", dir);
    snprintf(spec, sizeof(spec), "file:%s", path);
    Rank four[] = {{1, 4, 5, 0, NULL, 0, 0, 0},
                   {2, 4, 5, 0.05, NULL, 0, 0, 0},
                   {3, 4, 5, 0, NULL, 0, 0, 0},
                   {0, 4, 5, 0.2, NULL, 0, 0, 0}};
    run_ranks("file world 4, readers before rank 0", spec, four, 4, 21);
    check(count_entries(dir) == 1, "file: only PATH is left, no PATH.tmp.<pid>", dir);

    /* A stale file from an earlier run is replaced by rank 0 before readers come. */
    snprintf(path, sizeof(path), "%s/id-job2", dir);
    snprintf(spec, sizeof(spec), "file:%s", path);
    write_file(path, "stale junk from an earlier run", 30);
    int rc = file_rank0(spec, 4, 22, err, sizeof(err));
    check(rc == 0, "file: rank 0 replaces a stale file", err);
    run_ranks("file world 4, readers after rank 0", spec, four, 3, 22);

    Rank other_world[] = {{1, 3, 5, 0, "written for a world of 4 processes, but this run has 3", 0, 1.0, 0}};
    snprintf(spec, sizeof(spec), "file:%s", path);
    run_ranks("file: a reader rejects a file of another world size", spec, other_world, 1, 22);

    write_file(path, "not a rendezvous file at all", 28);
    Rank junk[] = {{1, 4, 5, 0, "is not a rendezvous file", 0, 1.0, 0}};
    run_ranks("file: a reader rejects junk", spec, junk, 1, 22);

    snprintf(spec, sizeof(spec), "file:%s/no/such/dir/id", dir);
    rc = file_rank0(spec, 2, 24, err, sizeof(err));
    check(rc == -1 && strstr(err, "could not write") && strstr(err, "No such file"),
          "file: rank 0 in a missing directory", err);

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Timeouts of 1 s, run side by side to keep the test short; each error must
 * say what happened. */
static void test_timeouts(void)
{
    char spec[512], dir[] = "/tmp/test_rendezvous_XXXXXX";
    Batch b[3];
    Rank no_root[] = {{1, 2, 1.0, 0, "could not connect to tcp://127.0.0.1:", 0.95, 2.0, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    start_ranks(&b[0], "tcp: rank 1 without rank 0 times out", spec, no_root, 1, 7);

    Rank missing[] = {{0, 3, 1.0, 0, "(missing: 2)", 0.95, 2.0, 0}, {1, 3, 5, 0, "rank 0 at tcp://", 0.5, 2.5, 0}};
    tcp_spec(spec, sizeof(spec), "127.0.0.1");
    start_ranks(&b[1], "tcp: rank 0 names the missing rank, and the waiting ones hear it gave up", spec, missing, 2, 8);

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    Rank late[] = {{2, 4, 1.0, 0, "did not appear within 1 s", 0.95, 2.0, 0}};
    snprintf(spec, sizeof(spec), "file:%s/id-never", dir);
    start_ranks(&b[2], "file: a reader without rank 0 times out", spec, late, 1, 23);
    for (int i = 0; i < 3; i++)
        finish_ranks(&b[i]);
    if (rmdir(dir) != 0)
        perror(dir);
}

static void test_specs(void)
{
    unsigned char blob[BLOB];
    fill(blob, 31);
    struct {
        const char *spec, *mention;
    } bad[] = {
        {"foo://node1:29500", "unknown method"},
        {"tcp://", "no :PORT"},
        {"tcp://node1", "no :PORT"},
        {"tcp://node1:", "PORT '' is not a number"},
        {"tcp://:29500", "no HOST"},
        {"tcp://node1:0", "PORT '0'"},
        {"tcp://node1:65536", "PORT '65536'"},
        {"tcp://node1:-5", "PORT '-5'"},
        {"tcp://node1:29500/", "PORT '29500/'"},
        {"tcp://node1:2950x", "PORT '2950x'"},
        {"tcp://fe80::1:29500", "in brackets"},
        {"tcp://[::1:29500", "without ']'"},
        {"tcp://[::1]29500", "no :PORT"},
        {"file:", "needs a path"},
        {"", "empty"},
        {NULL, "empty"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "", what[128];
        double t0 = rendezvous_now_();
        int rc = rendezvous_share(bad[i].spec, 1, 2, blob, BLOB, 0.5, err, sizeof(err));
        int ok = rc == -1 && strstr(err, bad[i].mention) && strstr(err, "rank 1: bad rendezvous") &&
                 rendezvous_now_() - t0 < 0.1;
        char err2[512] = "";
        ok &= rendezvous_check_spec(bad[i].spec, err2, sizeof(err2)) == -1 && strstr(err2, bad[i].mention);
        snprintf(what, sizeof(what), "bad spec '%s' rejected", bad[i].spec ? bad[i].spec : "(null)");
        check(ok, what, err);
    }
    const char *good[] = {"tcp://node1:29500", "tcp://10.0.0.1:1", "tcp://[fe80::1]:65535",
                          "file:/shared/job42/nccl_id"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char err[512] = "", what[128];
        snprintf(what, sizeof(what), "good spec '%s' accepted", good[i]);
        check(rendezvous_check_spec(good[i], err, sizeof(err)) == 0, what, err);
    }

    struct {
        int rank, world;
        size_t bytes;
        double timeout;
    } args[] = {{2, 2, BLOB, 1}, {-1, 2, BLOB, 1}, {0, 0, BLOB, 1}, {1, 2, 0, 1}, {1, 2, BLOB, 0}};
    for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
        char err[512] = "", what[128];
        int rc = rendezvous_share("tcp://127.0.0.1:29500", args[i].rank, args[i].world, blob, args[i].bytes,
                                  args[i].timeout, err, sizeof(err));
        snprintf(what, sizeof(what), "bad arguments rejected (rank %d, world %d, %zu bytes, timeout %g)", args[i].rank,
                 args[i].world, args[i].bytes, args[i].timeout);
        check(rc == -1 && strstr(err, "needs 0 <= rank < world"), what, err);
    }
}

static void env_ok(const char **env, const char *want)
{
    char spec[300] = "", err[512] = "", what[300];
    fake_env = env;
    int rc = rendezvous_spec_from_env(fake_env_lookup, spec, sizeof(spec), err, sizeof(err));
    snprintf(what, sizeof(what), "env makes '%s'", want);
    check(rc == 0 && strcmp(spec, want) == 0, what, rc == 0 ? spec : err);
}

static void env_error(const char *what, const char **env, size_t len, const char *mention)
{
    char spec[300] = "", err[512] = "";
    fake_env = env;
    int rc = rendezvous_spec_from_env(fake_env_lookup, spec, len, err, sizeof(err));
    check(rc == -1 && strstr(err, mention), what, err);
}

static void test_env(void)
{
    const char *plain[] = {"MASTER_ADDR", "node1", "MASTER_PORT", "29500", NULL};
    env_ok(plain, "tcp://node1:29500");
    const char *v6[] = {"MASTER_ADDR", "fe80::1", "MASTER_PORT", "29500", NULL};
    env_ok(v6, "tcp://[fe80::1]:29500");
    const char *v6b[] = {"MASTER_ADDR", "[::1]", "MASTER_PORT", "1234", NULL};
    env_ok(v6b, "tcp://[::1]:1234");

    const char *none[] = {NULL};
    env_error("env: neither variable", none, 300, "set MASTER_ADDR and MASTER_PORT");
    const char *addr_only[] = {"MASTER_ADDR", "node1", NULL};
    env_error("env: MASTER_ADDR without MASTER_PORT", addr_only, 300, "MASTER_ADDR is set but MASTER_PORT is not");
    const char *port_only[] = {"MASTER_PORT", "29500", NULL};
    env_error("env: MASTER_PORT without MASTER_ADDR", port_only, 300, "MASTER_PORT is set but MASTER_ADDR is not");
    const char *bad_port[] = {"MASTER_ADDR", "node1", "MASTER_PORT", "29500x", NULL};
    env_error("env: MASTER_PORT not a number", bad_port, 300, "MASTER_PORT='29500x'");
    const char *big_port[] = {"MASTER_ADDR", "node1", "MASTER_PORT", "70000", NULL};
    env_error("env: MASTER_PORT out of range", big_port, 300, "from 1 to 65535");
    const char *empty_addr[] = {"MASTER_ADDR", "", "MASTER_PORT", "29500", NULL};
    env_error("env: empty MASTER_ADDR", empty_addr, 300, "no HOST");
    env_error("env: spec buffer too small", plain, 10, "do not fit in 10 bytes");
}

int main(void)
{
    double t0 = rendezvous_now_();
    test_specs();
    test_env();
    test_timeouts();
    test_tcp();
    test_file();
    printf("%d passed, %d failed (%.1f s)\n", passed, failed, rendezvous_now_() - t0);
    return failed != 0;
}
