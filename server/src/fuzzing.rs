//! What the fuzz targets in `fuzz/` reach that is not public (built only
//! with the `fuzzing` cargo feature; not part of the API).

use agentrt_proto::a2a::v1 as a2a;
use agentrt_runtime::types::ContentBlock;

/// The user content of an A2A message (the text parts), or why it is
/// refused.
pub fn a2a_user_content(message: &a2a::Message) -> Result<Vec<ContentBlock>, tonic::Status> {
    crate::a2a::user_content(message)
}
