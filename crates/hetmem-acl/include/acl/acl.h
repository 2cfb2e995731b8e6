/* hetmem ACL library: the umbrella header (acl/acl.h). */
#ifndef HETMEM_ACL_ACL_H
#define HETMEM_ACL_ACL_H

#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts the library: reads the environment (HETMEM_BACKEND, HETMEM_HOST_*). configPath may be
 * NULL or "" (no configuration file); any other path must name a readable file, whose contents
 * are ignored (else ACL_ERROR_INVALID_FILE). ACL_ERROR_REPEAT_INITIALIZE if already started;
 * after aclFinalize it may be called again. */
ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
/* Releases everything made since aclInit (contexts, streams, events, memory). */
ACL_FUNC_VISIBILITY aclError aclFinalize(void);
/* The library's version: 1.17.0. */
ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion,
                                             int32_t *patchVersion);

#ifdef __cplusplus
}
#endif
#endif
