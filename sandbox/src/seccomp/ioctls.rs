//! The ioctl request numbers the filters allow, each spelled out from the kernel's uapi
//! (`_IOC(dir, type, nr, size)` = `dir << 30 | size << 16 | type << 8 | nr`; dir 1 = write,
//! 2 = read, 3 = both), and checked against the kernel headers' values in the tests.

/// `_IOC` of the kernel's uapi.
const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (ty << 8) | nr
}

const KVMIO: u64 = 0xae;
const UFFDIO: u64 = 0xaa;

/// `_IO(KVMIO, 0x80)`: enter the guest.
pub const KVM_RUN: u64 = ioc(0, KVMIO, 0x80, 0);
/// `_IOW(KVMIO, 0x46, struct kvm_userspace_memory_region)`: BAR moves, CXL decoder commits,
/// design `c` working areas, device teardown.
pub const KVM_SET_USER_MEMORY_REGION: u64 = ioc(1, KVMIO, 0x46, 32);
/// `_IOW(KVMIO, 0x79, struct kvm_ioeventfd)`: queue notify addresses at DRIVER_OK and reset.
pub const KVM_IOEVENTFD: u64 = ioc(1, KVMIO, 0x79, 64);
/// `_IOW(KVMIO, 0xa5, struct kvm_msi)`: MSI-X interrupts of virtio and CXL functions.
pub const KVM_SIGNAL_MSI: u64 = ioc(1, KVMIO, 0xa5, 32);
/// `_IOW(KVMIO, 0x76, struct kvm_irqfd)`.
pub const KVM_IRQFD: u64 = ioc(1, KVMIO, 0x76, 32);

/// `_IOR(UFFDIO, 0x02, struct uffdio_range)`: wake threads waiting on a range.
pub const UFFDIO_WAKE: u64 = ioc(2, UFFDIO, 0x02, 16);
/// `_IOWR(UFFDIO, 0x03, struct uffdio_copy)`: install pages.
pub const UFFDIO_COPY: u64 = ioc(3, UFFDIO, 0x03, 40);
/// `_IOWR(UFFDIO, 0x04, struct uffdio_zeropage)`.
pub const UFFDIO_ZEROPAGE: u64 = ioc(3, UFFDIO, 0x04, 32);
/// `_IOWR(UFFDIO, 0x06, struct uffdio_writeprotect)`: dirty tracking.
pub const UFFDIO_WRITEPROTECT: u64 = ioc(3, UFFDIO, 0x06, 24);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_match_the_kernel_headers() {
        // Values as the kernel's headers define them (linux/kvm.h, linux/userfaultfd.h).
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_SET_USER_MEMORY_REGION, 0x4020_ae46);
        assert_eq!(KVM_IOEVENTFD, 0x4040_ae79);
        assert_eq!(KVM_SIGNAL_MSI, 0x4020_aea5);
        assert_eq!(KVM_IRQFD, 0x4020_ae76);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xc020_aa04);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
    }
}
