//! The panic guard of every entry point (`ascendcl::entry`): a panic inside the library never
//! unwinds into C; the call answers `ACL_ERROR_RT_INTERNAL_ERROR` (507000) with the panic's
//! message, and later calls work.

use ascendcl::{aclGetRecentErrMsg, aclrtGetLastError, aclrtPeekAtLastError, entry, Fail};

fn recent() -> String {
    // SAFETY: the library's NUL-terminated message of this thread.
    unsafe { std::ffi::CStr::from_ptr(aclGetRecentErrMsg()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_panic_inside_an_entry_point_is_internal_error_with_its_message_never_an_unwind() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // keep the test output quiet
    let r = entry("aclrtTestPanic", || panic!("invariant broken at 0x1234"));
    std::panic::set_hook(prev);
    assert_eq!(r, 507_000);
    let m = recent();
    assert!(m.contains("aclrtTestPanic") && m.contains("0x1234"), "{m}");
    assert_eq!(aclrtPeekAtLastError(0), 507_000);
    // The next call works and succeeds; the last error stays until read.
    assert_eq!(entry("aclrtTestOk", || Ok(())), 0);
    assert_eq!(aclrtGetLastError(0), 507_000);
    assert_eq!(aclrtGetLastError(0), 0);
}

#[test]
fn a_failure_records_its_code_and_message_per_thread() {
    let r = entry("aclrtTestFail", || {
        Err(Fail::from(hetmem::Error::InvalidArgument(
            "device id 9 is not a device".into(),
        )))
    });
    assert_eq!(r, 107_000);
    assert!(recent().contains("device id 9"), "{}", recent());
    // Another thread has its own (empty) message and last error.
    std::thread::spawn(|| {
        assert_eq!(recent(), "");
        assert_eq!(aclrtPeekAtLastError(0), 0);
    })
    .join()
    .unwrap();
    // A NUL inside a message cannot cut it short in C.
    entry("aclrtTestNul", || Err(Fail::new(100_000, "a\0b")));
    assert!(recent().contains("a b"), "{}", recent());
}
