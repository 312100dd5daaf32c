/* test_wake: daemon/wake.c.  A send made while the callback runs (after
 * it took the queue) brings the callback back: the one case a wakeup can
 * be lost in.  Then four threads queue items and wake the loop in bursts
 * while the callback takes the queue (slowly: a sender often finds a
 * wakeup pending and writes nothing): every item is taken (the loop runs
 * until the last one; a timer fails the test after 10 s), the callback
 * ran fewer times than there were sends (they coalesce), and the handle
 * closes with its eventfd. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>
#include <uv.h>
#include "daemon/wake.h"

#define SENDERS 4
#define ITEMS 20000

static struct dwake wk;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long queued, taken, runs;
static uv_timer_t deadline;
static int timed_out;

static void take(struct dwake *w)
{
	struct timespec ts = { 0, 20000 };

	assert_ptr_equal(w, &wk);
	runs++;
	pthread_mutex_lock(&mu);
	taken += queued;
	queued = 0;
	pthread_mutex_unlock(&mu);
	/* Slow on purpose: senders queue more while this runs. */
	nanosleep(&ts, NULL);
	if (taken == (unsigned long)SENDERS * ITEMS) {
		uv_timer_stop(&deadline);
		dwake_close(&wk);
		uv_close((uv_handle_t *)&deadline, NULL);
	}
}

static void *sender(void *arg)
{
	(void)arg;
	for (int i = 0; i < ITEMS; i++) {
		/* In bursts, so sends land before, during and after callbacks. */
		if (i % 16 == 15) {
			struct timespec ts = { 0, 10000 };

			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&mu);
		queued++;
		pthread_mutex_unlock(&mu);
		dwake_send(&wk);
	}
	return NULL;
}

static void on_deadline(uv_timer_t *t)
{
	timed_out = 1;
	dwake_close(&wk);
	uv_close((uv_handle_t *)t, NULL);
}

/* The first callback has a thread queue one item and send while it is
 * still running, and waits for that send to return; the second callback
 * must come and take it. */
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int late_go, late_sent;

static void *late_sender(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	while (!late_go)
		pthread_cond_wait(&cv, &mu);
	queued++;
	pthread_mutex_unlock(&mu);
	dwake_send(&wk);
	pthread_mutex_lock(&mu);
	late_sent = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return NULL;
}

static void take_late(struct dwake *w)
{
	(void)w;
	runs++;
	pthread_mutex_lock(&mu);
	taken += queued;
	queued = 0;
	if (runs == 1) {
		late_go = 1;
		pthread_cond_broadcast(&cv);
		while (!late_sent)
			pthread_cond_wait(&cv, &mu);
	}
	pthread_mutex_unlock(&mu);
	if (taken == 2) {
		uv_timer_stop(&deadline);
		dwake_close(&wk);
		uv_close((uv_handle_t *)&deadline, NULL);
	}
}

static void test_send_during_callback(void **state)
{
	uv_loop_t loop;
	pthread_t t;

	(void)state;
	queued = taken = runs = 0;
	timed_out = 0;
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(dwake_init(&loop, &wk, take_late), 0);
	assert_int_equal(uv_timer_init(&loop, &deadline), 0);
	assert_int_equal(uv_timer_start(&deadline, on_deadline, 10000, 0), 0);
	assert_int_equal(pthread_create(&t, NULL, late_sender, NULL), 0);
	pthread_mutex_lock(&mu);
	queued = 1;
	pthread_mutex_unlock(&mu);
	dwake_send(&wk);
	uv_run(&loop, UV_RUN_DEFAULT);
	pthread_join(t, NULL);
	assert_false(timed_out);
	assert_int_equal(taken, 2);
	assert_int_equal(runs, 2);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_no_lost_wakeup(void **state)
{
	uv_loop_t loop;
	pthread_t t[SENDERS];

	(void)state;
	queued = taken = runs = 0;
	timed_out = 0;
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(dwake_init(&loop, &wk, take), 0);
	assert_true(wk.init);
	assert_int_equal(uv_timer_init(&loop, &deadline), 0);
	assert_int_equal(uv_timer_start(&deadline, on_deadline, 10000, 0), 0);
	for (int i = 0; i < SENDERS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, sender, NULL), 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	for (int i = 0; i < SENDERS; i++)
		pthread_join(t[i], NULL);
	assert_false(timed_out);
	assert_int_equal(taken, (unsigned long)SENDERS * ITEMS);
	assert_true(runs > 100 && runs < (unsigned long)SENDERS * ITEMS);
	/* Closed: the eventfd went with the handle. */
	assert_false(wk.init);
	assert_int_equal(wk.fd, -1);
	assert_int_equal(uv_loop_close(&loop), 0);
	print_message("wake: items=%d runs=%lu\n", SENDERS * ITEMS, runs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_send_during_callback),
		cmocka_unit_test(test_no_lost_wakeup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
