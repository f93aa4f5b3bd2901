/*
 * ycsb_worker - one ycsb_lmdb thread on LMDB (ycsb_worker.h): its txns,
 * the operations, and the writes of the open write txn that --log-commits
 * prints once the txn committed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ycsb_worker.h"

struct pending {
	uint32_t type, field;
	uint64_t keynum, version;
	char key[YCSB_KEY_MAX];
};

static void lmdb_warn(const struct worker *w, const char *what, int rc)
{
	fprintf(stderr, "ycsb_lmdb: thread %u: %s: %s\n", w->index, what, mdb_strerror(rc));
}

static void log_commits(struct worker *w)
{
	if (!w->cfg->log_commits || w->npend == 0)
		return;
	flockfile(stdout);
	for (uint64_t i = 0; i < w->npend; i++) {
		const struct pending *p = &w->pend[i];
		const char *op = w->loading ? "LOAD" : ycsb_op_name(p->type);

		if (p->field == YCSB_ALL_FIELDS)
			printf("COMMIT %s %s %" PRIu64 " %" PRIu64 " all\n", op, p->key, p->keynum,
			       p->version);
		else
			printf("COMMIT %s %s %" PRIu64 " %" PRIu64 " %u\n", op, p->key, p->keynum,
			       p->version, p->field);
	}
	fflush(stdout);
	funlockfile(stdout);
}

int worker_commit(struct worker *w)
{
	int rc;

	if (!w->wtxn)
		return 0;
	rc = mdb_txn_commit(w->wtxn);
	w->wtxn = NULL;
	if (rc) {
		lmdb_warn(w, "mdb_txn_commit", rc);
		w->lost += w->npend;
		w->npend = 0;
		return rc;
	}
	log_commits(w);
	w->npend = 0;
	return 0;
}

static void abort_writes(struct worker *w)
{
	if (w->wtxn)
		mdb_txn_abort(w->wtxn);
	w->wtxn = NULL;
	w->lost += w->npend;
	w->npend = 0;
}

static int begin_write(struct worker *w)
{
	int rc;

	if (w->wtxn)
		return 0;
	rc = mdb_txn_begin(w->env, NULL, 0, &w->wtxn);
	if (rc) {
		w->wtxn = NULL;
		lmdb_warn(w, "mdb_txn_begin", rc);
	}
	return rc;
}

/* A txn to read in: the open write txn, else the renewed read-only one. */
static int begin_read(struct worker *w, MDB_txn **txn)
{
	int rc;

	if (w->wtxn) {
		*txn = w->wtxn;
		return 0;
	}
	rc = w->rtxn ? mdb_txn_renew(w->rtxn) : mdb_txn_begin(w->env, NULL, MDB_RDONLY, &w->rtxn);
	if (rc) {
		lmdb_warn(w, "read txn", rc);
		return rc;
	}
	*txn = w->rtxn;
	return 0;
}

static void end_read(struct worker *w, MDB_txn *txn)
{
	if (txn == w->rtxn)
		mdb_txn_reset(w->rtxn);
}

/* Copy the record of @key into w->rec; ST_OK, ST_NOT_FOUND or ST_ERROR. */
static enum status get_record(struct worker *w, MDB_txn *txn, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v;
	int rc = mdb_get(txn, w->dbi, &k, &v);

	if (rc == MDB_NOTFOUND)
		return ST_NOT_FOUND;
	if (rc) {
		lmdb_warn(w, "mdb_get", rc);
		return ST_ERROR;
	}
	if (v.mv_size != YCSB_RECORD_LEN) {
		w->bad++;
		return ST_ERROR;
	}
	memcpy(w->rec, v.mv_data, YCSB_RECORD_LEN);
	if (w->cfg->verify &&
	    ycsb_record_check(op->key, op->key_len, w->rec, YCSB_RECORD_LEN, NULL, NULL)) {
		w->bad++;
		return ST_ERROR;
	}
	return ST_OK;
}

static enum status do_read(struct worker *w, const struct ycsb_op *op)
{
	MDB_txn *txn;
	enum status st;

	if (begin_read(w, &txn))
		return ST_ERROR;
	st = get_record(w, txn, op);
	end_read(w, txn);
	return st;
}

static enum status do_scan(struct worker *w, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v;
	MDB_cursor *cur;
	MDB_txn *txn;
	enum status st = ST_OK;
	int rc;

	if (begin_read(w, &txn))
		return ST_ERROR;
	rc = mdb_cursor_open(txn, w->dbi, &cur);
	if (rc) {
		lmdb_warn(w, "mdb_cursor_open", rc);
		end_read(w, txn);
		return ST_ERROR;
	}
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	for (uint32_t n = 0; rc == 0 && n < op->scan_len; n++) {
		if (v.mv_size != YCSB_RECORD_LEN) {
			w->bad++;
			st = ST_ERROR;
			break;
		}
		memcpy(w->rec, v.mv_data, YCSB_RECORD_LEN);
		if (w->cfg->verify &&
		    ycsb_record_check(k.mv_data, k.mv_size, w->rec, YCSB_RECORD_LEN, NULL, NULL)) {
			w->bad++;
			st = ST_ERROR;
			break;
		}
		if (n + 1 < op->scan_len)
			rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
	}
	if (rc && rc != MDB_NOTFOUND) {
		lmdb_warn(w, "mdb_cursor_get", rc);
		st = ST_ERROR;
	}
	mdb_cursor_close(cur);
	end_read(w, txn);
	return st;
}

/* Remember a write of the open txn for --log-commits. */
static void add_pending(struct worker *w, const struct ycsb_op *op)
{
	struct pending *p = &w->pend[w->npend++];

	p->type = op->type;
	p->field = op->field;
	p->keynum = op->keynum;
	p->version = op->version;
	memcpy(p->key, op->key, sizeof(p->key));
}

/* UPDATE, INSERT, RMW (and the load phase's inserts) in the write txn. */
enum status worker_write(struct worker *w, const struct ycsb_op *op)
{
	MDB_val k = { op->key_len, (void *)op->key }, v = { YCSB_RECORD_LEN, NULL };
	enum status st;
	int rc;

	if (begin_write(w))
		return ST_ERROR;
	if (op->type == YCSB_OP_INSERT) {
		v.mv_data = (void *)op->values;
	} else {
		st = get_record(w, w->wtxn, op);
		if (st != ST_OK) {
			/*
			 * Nothing written: do not keep LMDB's writer lock for an
			 * empty txn (a failed mdb_get may also have spoiled it).
			 */
			if (w->npend == 0 || st == ST_ERROR)
				abort_writes(w);
			return st;
		}
		if (op->field == YCSB_ALL_FIELDS)
			memcpy(w->rec, op->values, YCSB_RECORD_LEN);
		else
			memcpy(w->rec + (size_t)op->field * YCSB_FIELD_LEN, op->values[op->field],
			       YCSB_FIELD_LEN);
		v.mv_data = w->rec;
	}
	rc = mdb_put(w->wtxn, w->dbi, &k, &v, 0);
	if (rc) {
		lmdb_warn(w, "mdb_put", rc);
		abort_writes(w);
		if (!w->err)
			w->err = rc;
		return ST_ERROR;
	}
	add_pending(w, op);
	if (w->npend >= w->batch && worker_commit(w)) {
		if (!w->err)
			w->err = EIO;
		return ST_ERROR;
	}
	return ST_OK;
}

static enum status do_op(struct worker *w, const struct ycsb_op *op)
{
	switch (op->type) {
	case YCSB_OP_READ:
		return do_read(w, op);
	case YCSB_OP_SCAN:
		return do_scan(w, op);
	default:
		return worker_write(w, op);
	}
}

void *worker_run(void *arg)
{
	struct worker *w = arg;

	pthread_barrier_wait(w->start);
	w->t_start = now_ns();
	for (uint64_t i = 0; i < w->ops && !w->err; i++) {
		uint64_t t0, t1;
		enum status st;

		ycsb_next_op(&w->gen, &w->op);
		t0 = now_ns();
		st = do_op(w, &w->op);
		t1 = now_ns();
		hist_add(&w->h[w->op.type], t1 - t0, st);
	}
	if (worker_commit(w) && !w->err)
		w->err = EIO;
	if (w->rtxn)
		mdb_txn_abort(w->rtxn);
	w->rtxn = NULL;
	w->t_end = now_ns();
	return NULL;
}

struct worker *worker_new(const struct config *cfg, MDB_env *env, MDB_dbi dbi, uint64_t batch)
{
	struct worker *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->pend = calloc(batch, sizeof(*w->pend));
	if (!w->pend) {
		free(w);
		return NULL;
	}
	w->cfg = cfg;
	w->env = env;
	w->dbi = dbi;
	w->batch = batch;
	return w;
}

void worker_free(struct worker *w)
{
	if (w)
		free(w->pend);
	free(w);
}
