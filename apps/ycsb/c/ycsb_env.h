/*
 * ycsb_env - ycsb_lmdb's LMDB environment: a directory of plain files, or
 * (--pmo, guest build only) LMDB's data file in a PMO through the libpmo
 * backend, which holds a copy of the key until env_release().
 */
#ifndef YCSB_ENV_H
#define YCSB_ENV_H

#include "lmdb.h"
#include "ycsb_cli.h"
#include "ycsb_config.h"

/*
 * Open the environment of @cfg (creating cfg->dir) and its unnamed database;
 * @key is scratch space for the --pmo key, wiped after use.  0, or 1 after
 * printing why not.
 */
int env_open(const struct config *cfg, MDB_env **envp, MDB_dbi *dbi, char key[KEY_FILE_MAX + 1]);

/* After the last mdb_env_close(): wipe the backend's key copy. */
void env_release(void);

#endif /* YCSB_ENV_H */
