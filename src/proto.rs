//! Code generated from `proto/` by `tonic-prost-build` (never edited by hand), and the encoded
//! file descriptor set that server reflection serves.

/// The `baton.v1` package.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("baton.v1");
}

/// The encoded `FileDescriptorSet` of every file under `proto/` and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("baton_descriptor");

/// The path (`/package.Service/Method`) of every method of every service in an encoded
/// `FileDescriptorSet`; none when it does not decode.
pub fn method_paths(encoded: &[u8]) -> Vec<String> {
    use prost::Message;
    let Ok(set) = prost_types::FileDescriptorSet::decode(encoded) else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let package = file.package();
                let service = service.name();
                let qualified = if package.is_empty() {
                    service.to_owned()
                } else {
                    format!("{package}.{service}")
                };
                paths.push(format!("/{qualified}/{}", method.name()));
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use prost::Message;

    /// The descriptor set used by reflection decodes and contains the Lock service.
    #[test]
    fn descriptor_set_decodes() {
        let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)
            .expect("descriptor set decodes");
        let lock = set
            .file
            .iter()
            .find(|f| f.name() == "baton/v1/lock.proto")
            .expect("lock.proto is in the set");
        assert!(lock.service.iter().any(|s| s.name() == "LockService"));
        assert!(
            set.file
                .iter()
                .any(|f| f.name() == "google/protobuf/duration.proto"),
            "imports are included so reflection clients can resolve them"
        );
    }

    /// Every method of the descriptor set has its path.
    #[test]
    fn method_paths_cover_the_services() {
        let paths = super::method_paths(super::FILE_DESCRIPTOR_SET);
        for path in [
            "/baton.v1.LockService/Acquire",
            "/baton.v1.LockService/Hold",
            "/baton.v1.SemaphoreService/KeepAlive",
            "/baton.v1.RateLimitService/Check",
            "/baton.v1.AutocompleteService/CompleteRecent",
        ] {
            assert!(paths.iter().any(|p| p == path), "{path} in {paths:?}");
        }
        assert!(super::method_paths(b"not a descriptor set").is_empty());
    }
}
