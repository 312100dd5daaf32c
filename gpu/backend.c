/* Backend selection: cuda through the dlopen()ed plugin when it loads and
 * finds a device, cpu otherwise, with the reason for any fallback. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/plugin.h"

static struct dtc_backend cpu_backend = { "cpu", &dtc_cpu_ops, "host" };
static struct dtc_backend cuda_backend = { "cuda", NULL, "" };
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static void *cuda_handle;

static void say(char *why, unsigned whylen, const char *fmt, const char *a, const char *b)
{
	if (why && whylen)
		snprintf(why, whylen, fmt, a, b);
}

/* Directory part of `path` + "/" + rel into out; 0 if it does not fit. */
static int sibling(const char *path, const char *rel, char *out, size_t len)
{
	const char *slash = strrchr(path, '/');
	int n;

	if (!slash)
		return 0;
	n = snprintf(out, len, "%.*s/%s", (int)(slash - path), path, rel);
	return n > 0 && (size_t)n < len;
}

/* First existing candidate for the plugin, or 0 with the places tried. */
static int find_plugin(char *out, size_t len, char *tried, size_t tlen)
{
	char exe[PATH_MAX];
	Dl_info info;
	ssize_t n;

	tried[0] = 0;
	if (dladdr((void *)dtc_backend_load, &info) && info.dli_fname &&
	    info.dli_fname[0] == '/' && sibling(info.dli_fname, DTC_PLUGIN_FILE, out, len)) {
		if (access(out, R_OK) == 0)
			return 1;
		snprintf(tried, tlen, "%s", out);
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = 0;
		if (sibling(exe, DTC_PLUGIN_FILE, out, len) && access(out, R_OK) == 0)
			return 1;
		if (sibling(exe, "../lib/" DTC_PLUGIN_FILE, out, len)) {
			if (access(out, R_OK) == 0)
				return 1;
			snprintf(tried + strlen(tried), tlen - strlen(tried), "%s%s",
				 tried[0] ? ", " : "", out);
		}
	}
	return 0;
}

/* Load the plugin and open a device; caller holds load_lock. */
static int cuda_open(const char *plugin_path, char *why, unsigned whylen)
{
	char path[PATH_MAX], tried[2 * PATH_MAX + 8], msg[256];
	const struct dtc_backend_ops *ops = NULL;
	dtc_plugin_open_fn open_fn;
	const char *env = getenv("DTE_CUDA_PLUGIN");
	void *h;

	if (cuda_backend.ops)
		return 0;
	if (!plugin_path && env && env[0])
		plugin_path = env;
	if (plugin_path) {
		snprintf(path, sizeof(path), "%s", plugin_path);
	} else if (!find_plugin(path, sizeof(path), tried, sizeof(tried))) {
		say(why, whylen, "cuda plugin %s not found (looked at %s)", DTC_PLUGIN_FILE,
		    tried[0] ? tried : "nothing");
		return -1;
	}
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		say(why, whylen, "cannot load cuda plugin: %s%s", dlerror(), "");
		return -1;
	}
	open_fn = (dtc_plugin_open_fn)dlsym(h, DTC_PLUGIN_SYMBOL);
	if (!open_fn) {
		say(why, whylen, "%s is not a dted cuda plugin (no %s)", path, DTC_PLUGIN_SYMBOL);
		dlclose(h);
		return -1;
	}
	msg[0] = 0;
	if (open_fn(DTC_PLUGIN_ABI, &ops, cuda_backend.device, sizeof(cuda_backend.device),
		    msg, sizeof(msg)) != 0 || !ops) {
		say(why, whylen, "cuda unavailable: %s%s", msg[0] ? msg : "plugin refused", "");
		dlclose(h);
		return -1;
	}
	cuda_handle = h;
	cuda_backend.ops = ops;
	return 0;
}

const struct dtc_backend *dtc_backend_load(const char *prefer, const char *plugin_path,
					   char *why, unsigned whylen)
{
	const struct dtc_backend *be = &cpu_backend;

	if (why && whylen)
		why[0] = 0;
	if (!prefer)
		prefer = "auto";
	if (strcmp(prefer, "cpu") == 0)
		return &cpu_backend;
	if (strcmp(prefer, "auto") != 0 && strcmp(prefer, "cuda") != 0) {
		say(why, whylen, "unknown backend \"%s\"; using cpu%s", prefer, "");
		return &cpu_backend;
	}
	pthread_mutex_lock(&load_lock);
	if (cuda_open(plugin_path, why, whylen) == 0)
		be = &cuda_backend;
	pthread_mutex_unlock(&load_lock);
	return be;
}

static const struct dtc_backend *chosen;
static char chosen_why[256];

const struct dtc_backend *dtc_backend_get(const char *prefer, char *why, unsigned whylen)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	const struct dtc_backend *be;

	pthread_mutex_lock(&lock);
	if (!chosen)
		chosen = dtc_backend_load(prefer, NULL, chosen_why, sizeof(chosen_why));
	be = chosen;
	if (why && whylen)
		snprintf(why, whylen, "%s", chosen_why);
	pthread_mutex_unlock(&lock);
	return be;
}

const char *dtc_backend_name(const struct dtc_backend *be)
{
	return be->name;
}

const char *dtc_backend_device(const struct dtc_backend *be)
{
	return be->device;
}

const struct dtc_backend *dtc_backend_cpu(void)
{
	return &cpu_backend;
}
