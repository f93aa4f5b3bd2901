/*
 * fb_libpmo.h - the engine's backend on libpmo (guest): pcreate, pdestroy,
 * attach, psync and detach of guest/libpmo/pmo.h, all under one key.
 */
#ifndef FB_LIBPMO_H
#define FB_LIBPMO_H

#include "fb.h"
#include "pmo.h"

/* The backend's context: the key every PMO of the run is created under. */
struct fb_libpmo {
	char key[PMO_KEY_MAX + 1];
};

/*
 * Set @b up with @key (1..PMO_KEY_MAX bytes) and fill @ops; EINVAL for a key
 * of another length.
 */
int fb_libpmo_init(struct fb_libpmo *b, const char *key, struct fb_pmo_ops *ops);
/* Wipe the key. */
void fb_libpmo_wipe(struct fb_libpmo *b);

#endif /* FB_LIBPMO_H */
