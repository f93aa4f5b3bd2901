// daxrw: write or read bytes of a device-DAX character device (/dev/daxX.Y), which only
// supports mmap (no read/write). Used by the CXL scenarios to put a pattern into a CXL pmem
// region and read it back after a VMM restart.
//
//   daxrw write DEV OFFSET TEXT   copy TEXT to OFFSET
//   daxrw read DEV OFFSET LEN     print LEN bytes at OFFSET (as they are; no newline added)
//
// The mapping covers one 2 MiB alignment unit around OFFSET (device DAX faults in units of
// its alignment, and the mapping offset must be aligned to it).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define UNIT (2UL << 20)

static int usage(void) {
    fprintf(stderr, "usage: daxrw write DEV OFFSET TEXT | daxrw read DEV OFFSET LEN\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc != 5) return usage();
    int writing = strcmp(argv[1], "write") == 0;
    if (!writing && strcmp(argv[1], "read") != 0) return usage();
    char *end;
    unsigned long off = strtoul(argv[3], &end, 0);
    if (*end) return usage();
    size_t len = writing ? strlen(argv[4]) : strtoul(argv[4], &end, 0);
    if (!writing && *end) return usage();
    unsigned long base = off & ~(UNIT - 1);
    size_t in = off - base;
    if (len > UNIT - in) {
        fprintf(stderr, "daxrw: %zu bytes at %#lx cross a 2 MiB unit\n", len, off);
        return 1;
    }
    int fd = open(argv[2], O_RDWR);
    if (fd < 0) {
        fprintf(stderr, "daxrw: open %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    unsigned char *p = mmap(NULL, UNIT, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
    if (p == MAP_FAILED) {
        fprintf(stderr, "daxrw: mmap %s at %#lx: %s\n", argv[2], base, strerror(errno));
        return 1;
    }
    if (writing) {
        // Device DAX is memory: the stores are the write (msync is EINVAL here). The
        // device makes them durable at its shutdown flush.
        memcpy(p + in, argv[4], len);
        __sync_synchronize();
    } else if (fwrite(p + in, 1, len, stdout) != len) {
        return 1;
    }
    munmap(p, UNIT);
    close(fd);
    return 0;
}
