/*
 * test_util.h - what the C test files share: check macros and scratch directories.
 */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include <stdio.h>

/* Counted atomically: backend callbacks check from the engine's threads. */
extern int failures, checks;

#define CHECK(c)                                                                    \
	do {                                                                        \
		__atomic_fetch_add(&checks, 1, __ATOMIC_RELAXED);                  \
		if (!(c)) {                                                         \
			__atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);         \
			fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #c); \
		}                                                                   \
	} while (0)

#define CHECK_EQ(a, b)                                                                \
	do {                                                                          \
		unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
		__atomic_fetch_add(&checks, 1, __ATOMIC_RELAXED);                    \
		if (a_ != b_) {                                                       \
			__atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);           \
			fprintf(stderr, "%s:%d: FAILED: %s == %s (%llu != %llu)\n",   \
				__FILE__, __LINE__, #a, #b, a_, b_);                  \
		}                                                                     \
	} while (0)

/* A fresh, empty directory @name under the tests' base directory. */
const char *fresh_dir(const char *name);

/* The simulated-crash tests (test_crash.c). */
void test_crashes(void);

#endif /* TEST_UTIL_H */
