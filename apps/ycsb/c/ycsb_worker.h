/*
 * ycsb_worker - one ycsb_lmdb thread on LMDB: its generator, its read and
 * write txns, the writes of the open write txn (for --log-commits) and its
 * latency histograms.
 *
 * READ = mdb_get in a read-only txn (or in the thread's open write txn when
 * batching); SCAN = a cursor from the first key >= the start key over up to
 * scan_len records; UPDATE = read the record, replace the chosen field (or
 * all), put it back; INSERT = put; READ-MODIFY-WRITE = read then write in one
 * write txn.  Write txns commit after every @batch writes.  The phases
 * (ycsb_lmdb.c) make workers, run them and read their counts.
 */
#ifndef YCSB_WORKER_H
#define YCSB_WORKER_H

#include <pthread.h>
#include <stdint.h>

#include "lmdb.h"
#include "ycsb.h"
#include "ycsb_config.h"
#include "ycsb_report.h"

/* A write of the open txn, logged once it committed (ycsb_worker.c). */
struct pending;

struct worker {
	const struct config *cfg;
	MDB_env *env;
	MDB_dbi dbi;
	pthread_barrier_t *start;
	uint32_t index;
	int loading;		/* the load phase's worker: commits log as "LOAD" */
	uint64_t ops;
	struct ycsb gen;
	struct ycsb_op op;
	MDB_txn *rtxn;		/* reset between reads */
	MDB_txn *wtxn;		/* open write txn, or NULL */
	struct pending *pend;	/* writes of wtxn, cfg->batch of them at most */
	uint64_t npend, batch;
	uint64_t lost;		/* writes dropped by failed commits/aborts */
	uint64_t bad;		/* records that failed --verify */
	uint64_t t_start, t_end;	/* the run phase of this thread */
	uint8_t rec[YCSB_RECORD_LEN];
	struct hist h[YCSB_OP_COUNT];
	int err;		/* first fatal LMDB error */
};

/* A worker on @env/@dbi that commits every @batch writes; NULL without memory. */
struct worker *worker_new(const struct config *cfg, MDB_env *env, MDB_dbi dbi, uint64_t batch);

/* Free a worker (NULL is fine); its txns must be closed. */
void worker_free(struct worker *w);

/* Commit the open write txn, if any; 0 or the LMDB error (its writes count as lost). */
int worker_commit(struct worker *w);

/* UPDATE, INSERT, RMW (and the load phase's inserts) in the write txn. */
enum status worker_write(struct worker *w, const struct ycsb_op *op);

/*
 * The run phase of one thread (a pthread start routine): waits at w->start,
 * then runs w->ops operations of w->gen and commits what is left.
 */
void *worker_run(void *arg);

#endif /* YCSB_WORKER_H */
