// The Node agent's native part (a Node-API addon, built by prepare.sh): JavaScript has no way to
// make a system call, so AWAIT_REQUEST, Sandfork's private one (native-vmm/src/agent.rs), is
// made here, and the exit at the end (exit_group without Node's teardown). It also reseeds
// OpenSSL's random generator, whose state every fork of a template
// shares (Node seeds it at start-up, before the snapshot), from the request's fresh entropy.
#include <errno.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <node_api.h>

// "SF" and 1: the one definition is AWAIT_REQUEST_SYSCALL in native-vmm/src/agent.rs.
#define AWAIT_REQUEST 0x53460001L

// OpenSSL's, resolved in the node binary (which exports its OpenSSL) when the addon is loaded.
extern void RAND_seed(const void *buf, int num);

// The Buffer that is the call's only argument, or NULL after throwing a TypeError.
static void *buffer_argument(napi_env env, napi_callback_info info, size_t *length) {
  size_t argc = 1;
  napi_value argv[1];
  void *data = NULL;
  bool is_buffer = false;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 ||
      napi_is_buffer(env, argv[0], &is_buffer) != napi_ok || !is_buffer ||
      napi_get_buffer_info(env, argv[0], &data, length) != napi_ok) {
    napi_throw_type_error(env, NULL, "expected one Buffer");
    return NULL;
  }
  return data;
}

// awaitRequest(buffer): AWAIT_REQUEST(buffer, buffer.length); the request's length, or -errno
// (-E2BIG: the size needed is at the buffer's start, a little-endian u64).
static napi_value await_request(napi_env env, napi_callback_info info) {
  size_t length = 0;
  void *data = buffer_argument(env, info, &length);
  if (data == NULL) return NULL;
  long n = syscall(AWAIT_REQUEST, data, length);
  napi_value result;
  napi_create_int64(env, n < 0 ? -(int64_t)errno : (int64_t)n, &result);
  return result;
}

// reseed(buffer): mixes the bytes into OpenSSL's primary generator, which reseeds it (and so
// every per-thread generator drawn from it at its next use).
static napi_value reseed(napi_env env, napi_callback_info info) {
  size_t length = 0;
  void *data = buffer_argument(env, info, &length);
  if (data == NULL) return NULL;
  RAND_seed(data, (int)length);
  return NULL;
}

// exitNow(code): exit_group(code) at once, as Python's os._exit: no atexit handlers, no thread
// joins, no teardown (the VM is reset or discarded after it).
static napi_value exit_now(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int32_t code = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 || napi_get_value_int32(env, argv[0], &code) != napi_ok) {
    napi_throw_type_error(env, NULL, "expected an exit code");
    return NULL;
  }
  syscall(SYS_exit_group, code);
  return NULL;
}

NAPI_MODULE_INIT() {
  napi_value function;
  napi_create_function(env, "awaitRequest", NAPI_AUTO_LENGTH, await_request, NULL, &function);
  napi_set_named_property(env, exports, "awaitRequest", function);
  napi_create_function(env, "reseed", NAPI_AUTO_LENGTH, reseed, NULL, &function);
  napi_set_named_property(env, exports, "reseed", function);
  napi_create_function(env, "exitNow", NAPI_AUTO_LENGTH, exit_now, NULL, &function);
  napi_set_named_property(env, exports, "exitNow", function);
  return exports;
}
