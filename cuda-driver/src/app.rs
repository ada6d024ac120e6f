//! The small application side: devices, their UUIDs, primary contexts, device memory
//! and copies. Enough for a test workload that runs on a real GPU and on the fake
//! library alike, and for copying custom-storage regions.

use std::ffi::c_int;

use crate::driver::Driver;
use crate::error::Error;
use crate::sys::{CUcontext, CUuuid};
use crate::uuid::Uuid;

/// A device (`CUdevice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(pub i32);

/// A context (`CUcontext`, as an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context(usize);

/// A device address (`CUdeviceptr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// `bytes` further on.
    pub fn offset(self, bytes: usize) -> Self {
        Self(self.0 + bytes as u64)
    }
}

impl Driver {
    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<usize, Error> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a writable int.
        let code = unsafe { (self.api.device_get_count)(&mut n) };
        self.check(code, "cuDeviceGetCount", None)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `cuDeviceGet`.
    pub fn device_get(&self, ordinal: usize) -> Result<Device, Error> {
        let mut dev: c_int = -1;
        let ordinal = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
        // SAFETY: `dev` is a writable int.
        let code = unsafe { (self.api.device_get)(&mut dev, ordinal) };
        self.check(code, "cuDeviceGet", None)?;
        Ok(Device(dev))
    }

    /// `cuDeviceGetUuid_v2`.
    pub fn device_uuid(&self, device: Device) -> Result<Uuid, Error> {
        let mut uuid = CUuuid::default();
        // SAFETY: `uuid` is a writable CUuuid.
        let code = unsafe { (self.api.device_get_uuid)(&mut uuid, device.0) };
        self.check(code, "cuDeviceGetUuid", None)?;
        Ok(Uuid::from_cu(uuid))
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_ctx_retain(&self, device: Device) -> Result<Context, Error> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a writable pointer.
        let code = unsafe { (self.api.primary_ctx_retain)(&mut ctx, device.0) };
        self.check(code, "cuDevicePrimaryCtxRetain", None)?;
        Ok(Context(ctx as usize))
    }

    /// `cuCtxSetCurrent`: `context` becomes the calling thread's.
    pub fn ctx_set_current(&self, context: Context) -> Result<(), Error> {
        // SAFETY: `context` came from the driver (`primary_ctx_retain`).
        let code = unsafe { (self.api.ctx_set_current)(context.0 as CUcontext) };
        Ok(self.check(code, "cuCtxSetCurrent", None)?)
    }

    /// `cuCtxSynchronize`: waits for the current context's work.
    pub fn ctx_synchronize(&self) -> Result<(), Error> {
        // SAFETY: no arguments.
        let code = unsafe { (self.api.ctx_synchronize)() };
        Ok(self.check(code, "cuCtxSynchronize", None)?)
    }

    /// `cuMemAlloc_v2` in the current context.
    pub fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr, Error> {
        let mut ptr = 0u64;
        // SAFETY: `ptr` is a writable CUdeviceptr.
        let code = unsafe { (self.api.mem_alloc)(&mut ptr, bytes) };
        self.check(code, "cuMemAlloc", None)?;
        Ok(DevicePtr(ptr))
    }

    /// `cuMemFree_v2`.
    pub fn mem_free(&self, ptr: DevicePtr) -> Result<(), Error> {
        // SAFETY: the driver checks the device address; no host memory is involved.
        let code = unsafe { (self.api.mem_free)(ptr.0) };
        Ok(self.check(code, "cuMemFree", None)?)
    }

    /// `cuMemcpyHtoD_v2`: `src` to device memory at `dst`.
    pub fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), Error> {
        // SAFETY: `src` is `src.len()` readable bytes; the driver checks the device range.
        let code = unsafe { (self.api.memcpy_htod)(dst.0, src.as_ptr().cast(), src.len()) };
        Ok(self.check(code, "cuMemcpyHtoD", None)?)
    }

    /// `cuMemcpyDtoH_v2`: device memory at `src` into `dst`.
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), Error> {
        // SAFETY: `dst` is `dst.len()` writable bytes; the driver checks the device range.
        let code = unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), src.0, dst.len()) };
        Ok(self.check(code, "cuMemcpyDtoH", None)?)
    }
}
