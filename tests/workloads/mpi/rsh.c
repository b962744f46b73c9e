/* rsh: the client half of the rsh pair (rshd.c), used as Open MPI's
 * remote launcher (`--mca plm_rsh_agent PATH/rsh`) in place of ssh.
 *
 *   rsh [-x] [-T] [-q] [-p PORT] HOST COMMAND...
 *
 * Connects to HOST's rshd (IPv4, HOST resolved with getaddrinfo; PORT from
 * -p, else $RSH_PORT, else 7222), sends the words of COMMAND joined by
 * spaces and a '\n' (as ssh does, they form one shell command line on the
 * remote side), then relays its stdin to the connection and the connection
 * to its stdout until the remote side closes it; it then exits 0. The
 * remote command's stderr arrives merged into stdout. When stdin ends rsh
 * stops reading it but does not pass the end on: the connection stays
 * established in both directions for as long as the remote tree holds it,
 * which is what a checkpoint of the job can carry (a half-closed TCP
 * connection cannot be restored). -x, -T and -q (ssh options Open MPI may
 * add) are accepted and ignored. Exit status 255 if the connection cannot
 * be made (as ssh), 1 if writing to stdout fails.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int connect_to(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai, *a;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e != 0) {
        fprintf(stderr, "rsh: %s: %s\n", host, gai_strerror(e));
        exit(255);
    }
    int s = -1;
    for (a = ai; a; a = a->ai_next) {
        s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s >= 0 && connect(s, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (s >= 0)
            close(s);
        s = -1;
    }
    freeaddrinfo(ai);
    if (s < 0) {
        fprintf(stderr, "rsh: connecting to %s:%s: %s\n", host, port, strerror(errno));
        exit(255);
    }
    return s;
}

/* The command words joined by spaces, with a final '\n'. */
static char *command_line(int argc, char **argv)
{
    size_t len = 1;
    for (int i = 0; i < argc; i++)
        len += strlen(argv[i]) + 1;
    char *line = malloc(len + 1), *p = line;
    if (!line)
        exit(255);
    for (int i = 0; i < argc; i++) {
        if (strchr(argv[i], '\n')) {
            fprintf(stderr, "rsh: the command must not contain a newline\n");
            exit(255);
        }
        p += sprintf(p, "%s%s", i ? " " : "", argv[i]);
    }
    strcpy(p, "\n");
    return line;
}

static int relay(int s)
{
    static char buf[65536];
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = s, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return 1;
        }
        if (fds[1].revents) {
            ssize_t n = read(s, buf, sizeof buf);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return 0; /* the remote side closed (or reset) it */
            if (write_all(1, buf, (size_t)n) != 0)
                return 1;
        }
        if (fds[0].revents) {
            ssize_t n = read(0, buf, sizeof buf);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0 || write_all(s, buf, (size_t)n) != 0)
                fds[0].fd = -1; /* stdin ended: stop reading it */
        }
    }
}

int main(int argc, char **argv)
{
    const char *port = getenv("RSH_PORT");
    int i = 1;
    if (!port || !*port)
        port = "7222";
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-p") && i + 1 < argc)
            port = argv[++i];
        else if (strcmp(argv[i], "-x") && strcmp(argv[i], "-T") && strcmp(argv[i], "-q")) {
            fprintf(stderr, "rsh: unknown option %s\n", argv[i]);
            return 255;
        }
    }
    if (argc - i < 2) {
        fprintf(stderr, "usage: rsh [-x] [-T] [-q] [-p PORT] HOST COMMAND...\n");
        return 255;
    }
    signal(SIGPIPE, SIG_IGN);
    int s = connect_to(argv[i], port);
    char *line = command_line(argc - i - 1, argv + i + 1);
    if (write_all(s, line, strlen(line)) != 0) {
        fprintf(stderr, "rsh: sending the command: %s\n", strerror(errno));
        return 255;
    }
    free(line);
    return relay(s);
}
