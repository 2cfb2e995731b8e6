//! The published calls of the families hetmem covers that it does not implement: each is
//! exported and answers `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000) with a message saying why.
