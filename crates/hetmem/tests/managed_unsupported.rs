//! Where userfaultfd is refused (here: a seccomp filter in a child process), managed memory
//! fails with UNSUPPORTED_FEATURE (ACL 207000) saying why, and everything else still works.

mod common;

/// Why this file runs on the host backend only.
const HOST_ONLY: &str =
    "the host backend's managed memory is built on userfaultfd, and this checks its refusal \
     when a seccomp filter denies that system call; on cuda managed memory is \
     cuMemAllocManaged, which uses no userfaultfd, so denying it changes nothing there";

use common::{output_text, run_test_in_child, runtime_with};

#[test]
fn managed_allocation_without_userfaultfd_is_unsupported_feature() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    let out = run_test_in_child("no_uffd_child", &[("HETMEM_MANAGED_NO_UFFD_CHILD", "1")]);
    let text = output_text(&out);
    assert!(
        out.status.success() && text.contains("no-uffd child ok"),
        "{text}"
    );
}

/// Refuses `userfaultfd(2)` with EPERM for this thread (`seccomp(SECCOMP_MODE_FILTER)`).
fn refuse_userfaultfd() {
    let nr = libc::SYS_userfaultfd as u32;
    let mut filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A == nr: next, else skip one
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: nr,
        },
        // return SECCOMP_RET_ERRNO | EPERM
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x0005_0000 | libc::EPERM as u32,
        },
        // return SECCOMP_RET_ALLOW
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with documented arguments; the program outlives the call (the kernel
    // copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog
            ),
            0
        );
    }
}

#[test]
fn no_uffd_child() {
    if common::file_not_applicable(HOST_ONLY) {
        return;
    }
    if std::env::var_os("HETMEM_MANAGED_NO_UFFD_CHILD").is_none() {
        return;
    }
    refuse_userfaultfd();
    let rt = runtime_with(1, 64 << 20);
    let ctx = rt.driver().create_context().unwrap();
    for _ in 0..2 {
        let e = ctx.alloc_managed(1 << 21, 1).unwrap_err();
        assert_eq!(e.acl_error(), 207_000, "{e}");
        assert_eq!(e.ze_result(), 0x7800_0003, "{e}");
        assert!(matches!(
            e,
            hetmem::Error::Acl(hetmem::AclCode::RtFeatureNotSupport, _)
        ));
        assert!(e.message().contains("userfaultfd"), "{e}");
        assert!(
            e.message().contains("EPERM") || e.message().contains("not permitted"),
            "{e}"
        );
    }
    let dev = rt.driver().device(0).unwrap();
    assert_eq!(ctx.create_stream(&dev).unwrap_err().acl_error(), 207_000);
    // Argument errors still come first and the rest of the library works.
    assert_eq!(ctx.alloc_managed(0, 1).unwrap_err().acl_error(), 100_000);
    let p = ctx
        .alloc_device(&dev, &hetmem::AllocDesc::new(1 << 21))
        .unwrap();
    ctx.free_memory(p).unwrap();
    println!("no-uffd child ok");
}
