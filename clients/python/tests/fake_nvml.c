/* A stand-in for libnvidia-ml.so.1 that plays a known power trace against the
 * wall clock, for tests of mxserve.rlhf.power and the GPU baseline's energy meter.
 * The tests build it with `cc -shared -fPIC` and point MXSERVE_NVML_LIBRARY at it.
 *
 * $MXSERVE_FAKE_NVML_TRACE names a text file of lines `UNIX_SECONDS WATTS`
 * (ascending times; '#' starts a comment): the power is WATTS from that time
 * until the next line's, the first line's before it, the last line's after.
 * What the real NVML gives on an Ampere-or-newer board, from that one trace:
 *   - NVML_FI_DEV_POWER_INSTANT (nvmlDeviceGetFieldValues): the power now;
 *   - nvmlDeviceGetPowerUsage: the mean power of the last second (a moving
 *     average, the reading that misses short phases);
 *   - nvmlDeviceGetTotalEnergyConsumption: the exact integral of the power, in
 *     whole millijoules, from an hour before the trace's first time.
 * $MXSERVE_FAKE_NVML_NO_COUNTER=1: the energy counter is NOT_SUPPORTED (a
 * pre-Volta board); $MXSERVE_FAKE_NVML_NO_INSTANT=1: the field is NOT_SUPPORTED.
 * The time base is CLOCK_REALTIME, the clock of Python's time.time(), so a test
 * computes the same integrals over the same instants. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_UNKNOWN 999
#define NVML_FI_DEV_POWER_INSTANT 186
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define MAX_POINTS 4096

typedef void* nvmlDevice_t;

/* nvml.h's nvmlFieldValue_t. */
typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
  int siVal;
  unsigned short usVal;
} nvmlValue_t;
typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  int nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

static double times[MAX_POINTS], watts[MAX_POINTS];
static int points;
static int no_counter, no_instant;
static int device;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int flag(const char* name) {
  const char* value = getenv(name);
  return value != NULL && strcmp(value, "1") == 0;
}

/* The power at time t. */
static double power_at(double t) {
  int i = 0;
  while (i + 1 < points && times[i + 1] <= t) ++i;
  return watts[i];
}

/* Joules from an hour before the first point up to t: piece by piece, exactly. */
static double energy_until(double t) {
  double joules = 0, from = times[0] - 3600;
  for (int i = 0; i < points && from < t; ++i) {
    const double to = i + 1 < points && times[i + 1] < t ? times[i + 1] : t;
    if (to > from) joules += (to - from) * watts[i];
    from = to;
  }
  return joules;
}

int nvmlInit_v2(void) {
  const char* path = getenv("MXSERVE_FAKE_NVML_TRACE");
  FILE* file = path != NULL ? fopen(path, "r") : NULL;
  if (file == NULL) return NVML_ERROR_UNKNOWN;
  char line[256];
  points = 0;
  while (points < MAX_POINTS && fgets(line, sizeof line, file) != NULL) {
    if (line[0] == '#') continue;
    if (sscanf(line, "%lf %lf", &times[points], &watts[points]) == 2) ++points;
  }
  fclose(file);
  no_counter = flag("MXSERVE_FAKE_NVML_NO_COUNTER");
  no_instant = flag("MXSERVE_FAKE_NVML_NO_INSTANT");
  return points > 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

int nvmlShutdown(void) { return NVML_SUCCESS; }

const char* nvmlErrorString(int code) {
  switch (code) {
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* handle) {
  if (index != 0) return NVML_ERROR_INVALID_ARGUMENT;
  *handle = &device;
  return NVML_SUCCESS;
}

int nvmlDeviceGetName(nvmlDevice_t handle, char* name, unsigned length) {
  (void)handle;
  if (length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(name, length, "%s", "Fake Traced GPU");
  return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t handle, unsigned* milliwatts) {
  (void)handle;
  const double t = now();
  *milliwatts = (unsigned)((energy_until(t) - energy_until(t - 1.0)) * 1000.0);
  return NVML_SUCCESS;
}

int nvmlDeviceGetFieldValues(nvmlDevice_t handle, int count, nvmlFieldValue_t* values) {
  (void)handle;
  if (count < 0 || (count > 0 && values == NULL)) return NVML_ERROR_INVALID_ARGUMENT;
  const double t = now();
  for (int i = 0; i < count; ++i) {
    values[i].timestamp = (long long)(t * 1e6);
    values[i].latencyUsec = 0;
    if (values[i].fieldId != NVML_FI_DEV_POWER_INSTANT || no_instant) {
      values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
      continue;
    }
    values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    values[i].value.uiVal = (unsigned)(power_at(t) * 1000.0);
    values[i].nvmlReturn = NVML_SUCCESS;
  }
  return NVML_SUCCESS;
}

int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t handle, unsigned long long* millijoules) {
  (void)handle;
  if (no_counter) return NVML_ERROR_NOT_SUPPORTED;
  *millijoules = (unsigned long long)(energy_until(now()) * 1000.0);
  return NVML_SUCCESS;
}
