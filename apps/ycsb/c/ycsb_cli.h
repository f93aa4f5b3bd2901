/*
 * ycsb_cli - ycsb_lmdb's command line: the options into struct config, and
 * the --pmo key file.
 */
#ifndef YCSB_CLI_H
#define YCSB_CLI_H

#include "ycsb_config.h"

#define KEY_FILE_MAX	64	/* PMO keys are 1..64 bytes */

/*
 * Fill @cfg from the command line, defaults for what is not given.  Bad
 * options print the usage (or what is wrong) and exit with status 2.
 */
void parse_args(int argc, char **argv, struct config *cfg);

/*
 * The PMO key: the file's bytes without a trailing newline, 1..64 bytes, as
 * a string in @key.  0, or -1 after printing why not.
 */
int read_key(const char *path, char key[KEY_FILE_MAX + 1]);

#endif /* YCSB_CLI_H */
