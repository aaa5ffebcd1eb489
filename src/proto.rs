//! Code generated from `proto/` by `tonic-prost-build` (never edited by hand), and the encoded
//! file descriptor set that server reflection serves.

/// The `baton.v1` package.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("baton.v1");
}

/// The encoded `FileDescriptorSet` of every file under `proto/` and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("baton_descriptor");

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
}
