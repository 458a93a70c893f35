/* A fake librocm-core.so: the ROCm version that the amdsmi package reads with
 * amdsmi_get_rocm_version() (getROCmVersion, rocm-core's rocm_version.h). The version is
 * FAKEAMDSMI_ROCM_VERSION ("7.0.2" unless set); "fail" makes the call answer an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned getROCmVersion(unsigned *major, unsigned *minor, unsigned *patch) {
    const char *v = getenv("FAKEAMDSMI_ROCM_VERSION");
    if (!v) v = "7.0.2";
    if (strcmp(v, "fail") == 0 || !major || !minor || !patch) return 1;
    if (sscanf(v, "%u.%u.%u", major, minor, patch) != 3) return 1;
    return 0;
}
