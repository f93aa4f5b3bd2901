/*
 * fb_files.h - a TEST backend for the engine: one ordinary file per "PMO" in
 * a directory, mapped MAP_SHARED, msync() as psync.  It is not atomic (a
 * crash in the middle of msync leaves a mix of old and new pages) and not
 * encrypted; it exists to run and test the engine on a host without PMOs.
 * It keeps PMO rules: names of 1..63 of [A-Za-z0-9._-] not starting with
 * '.', sizes whole pages, one writer or many readers per object (EBUSY),
 * no destroy while attached (EBUSY).
 */
#ifndef FB_FILES_H
#define FB_FILES_H

#include "fb.h"

struct fb_files;

/* A backend on directory @dir (created if missing); NULL with errno. */
struct fb_files *fb_files_open(const char *dir);
/* Detach whatever is still attached and free @f. */
void fb_files_close(struct fb_files *f);
/* The callbacks of @f. */
void fb_files_ops(struct fb_files *f, struct fb_pmo_ops *ops);

#endif /* FB_FILES_H */
