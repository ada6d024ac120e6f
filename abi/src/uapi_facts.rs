//! Every fact of every kernel uAPI module ([`crate::kfd`], [`crate::amdgpu_drm`]): what
//! the header check (`abi/tests/uapi_headers.rs`) compares with the system headers.

use crate::uapi::Fact;

/// Every fact of every uAPI module, in declaration order.
pub fn all() -> impl Iterator<Item = &'static Fact> {
    [
        crate::kfd::LAYOUT,
        crate::kfd::CONSTS,
        crate::kfd::IOCTLS,
        crate::amdgpu_drm::LAYOUT,
        crate::amdgpu_drm::CONSTS,
        crate::amdgpu_drm::IOCTLS,
    ]
    .into_iter()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for fact in all() {
            assert!(seen.insert(fact.c_expr()), "listed twice: {fact}");
        }
        assert!(seen.len() > 100);
    }
}
