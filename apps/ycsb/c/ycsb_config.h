/*
 * ycsb_config - the settings of one ycsb_lmdb run: filled from the command
 * line by parse_args() (ycsb_cli.c), read by the driver (ycsb_lmdb.c).
 */
#ifndef YCSB_CONFIG_H
#define YCSB_CONFIG_H

#include <stdint.h>

#include "ycsb.h"

struct config {
	struct ycsb_workload w;		/* --workload */
	/* --records, --ops, --seed, --batch, --load-batch, --map-size (bytes) */
	uint64_t records, ops, seed, batch, load_batch, map_size;
	uint32_t threads;		/* --threads */
	/* --phase (load, run), --check, --dump, --write-all-fields, --verify,
	 * --nosync, --log-commits: 0 or 1 */
	int load, run, check, dump, write_all, verify, nosync, log_commits;
	/* --dir; --csv and --pmo, NULL when not given (no --pmo: plain files) */
	const char *dir, *csv, *pmo_keyfile;
};

#endif /* YCSB_CONFIG_H */
