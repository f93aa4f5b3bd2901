// SPDX-License-Identifier: GPL-2.0
/*
 * Requests and answers built in C with guest/include/uapi/virtio_pmo.h, for
 * tests/c_layout.rs: each structure filled with distinct values and printed
 * as its size and bytes; the Rust side parses or decodes them with proto/
 * and compares the values.  (The layouts and constants themselves are
 * compared field by field from the header by the test, not from this
 * file.)
 */
#include <endian.h>
#include <stdio.h>
#include <string.h>

#include "virtio_pmo.h"

static void dump(const char *name, const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;

	printf("struct %s %zu ", name, n);
	for (i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

#define DUMP(s, v) dump(#s, &(v), sizeof(v))

static __le32 key(__u8 *dst, const char *k)
{
	memcpy(dst, k, strlen(k));
	return htole32(strlen(k));
}

int main(void)
{
	struct virtio_pmo_config cfg = {
		.version = htole32(1), .page_size = htole32(4096),
		.window_size = htole64(0x0102030405060708ULL),
		.max_name_len = htole32(63), .max_key_len = htole32(64),
		.max_pmo_size = htole64(0x1112131415161718ULL),
	};
	DUMP(virtio_pmo_config, cfg);

	struct virtio_pmo_resp_hdr rh = {
		.status = htole32(VIRTIO_PMO_S_BADMSG), .len = htole32(0x2a),
	};
	DUMP(virtio_pmo_resp_hdr, rh);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_create c;
	} __attribute__((packed)) create = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_CREATE),
		       htole32(sizeof(struct virtio_pmo_create)) },
		.c = { .name = "layout-create", .size = htole64(0x2122232425262728ULL) },
	};
	create.c.key_len = key(create.c.key, "k3y-create");
	DUMP(create, create);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_destroy d;
	} __attribute__((packed)) destroy = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_DESTROY),
		       htole32(sizeof(struct virtio_pmo_destroy)) },
		.d = { .name = "layout-destroy" },
	};
	destroy.d.key_len = key(destroy.d.key, "k3y-destroy");
	DUMP(destroy, destroy);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_attach a;
	} __attribute__((packed)) attach = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_ATTACH),
		       htole32(sizeof(struct virtio_pmo_attach)) },
		.a = { .name = "layout-attach", .perm = htole32(VIRTIO_PMO_PERM_WRITE) },
	};
	attach.a.key_len = key(attach.a.key, "k3y-attach");
	DUMP(attach, attach);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_handle x;
	} __attribute__((packed)) psync = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_PSYNC),
		       htole32(sizeof(struct virtio_pmo_handle)) },
		.x = { htole64(0x3132333435363738ULL) },
	};
	DUMP(psync, psync);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_set_design d;
	} __attribute__((packed)) design = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_SET_DESIGN),
		       htole32(sizeof(struct virtio_pmo_set_design)) },
		.d = { .name = "sp-id" },
	};
	DUMP(set_design, design);

	struct {
		struct virtio_pmo_req_hdr h;
		struct virtio_pmo_list l;
	} __attribute__((packed)) list = {
		.h = { htole16(VIRTIO_PMO_VERSION), htole16(VIRTIO_PMO_OP_LIST),
		       htole32(sizeof(struct virtio_pmo_list)) },
		.l = { htole32(0x41424344) },
	};
	DUMP(list, list);

	struct virtio_pmo_attach_resp ar = {
		htole64(0x5152535455565758ULL), htole64(0x6162636465666768ULL),
		htole64(0x7172737475767778ULL),
	};
	DUMP(virtio_pmo_attach_resp, ar);

	struct virtio_pmo_psync_resp pr = { htole64(0x8182838485868788ULL) };
	DUMP(virtio_pmo_psync_resp, pr);

	struct virtio_pmo_list_resp lr = {
		.name = "layout-list", .size = htole64(0xa1a2a3a4a5a6a7a8ULL),
		.attached = htole32(VIRTIO_PMO_LIST_READERS), .more = htole32(1),
	};
	DUMP(virtio_pmo_list_resp, lr);

	struct virtio_pmo_event ev = {
		.kind = htole32(VIRTIO_PMO_EVENT_PAGE_BAD), .handle = htole64(0xb1b2b3b4b5b6b7b8ULL),
		.page = htole64(0xc1c2c3c4c5c6c7c8ULL),
	};
	DUMP(virtio_pmo_event, ev);
	return 0;
}
