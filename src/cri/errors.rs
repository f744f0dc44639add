//! Mapping of Berth's errors to gRPC status codes.

use tonic::Status;

use crate::image::ImageError;

impl From<ImageError> for Status {
    fn from(e: ImageError) -> Self {
        let msg = e.to_string();
        match e {
            ImageError::InvalidReference(_) | ImageError::InvalidArgument(_) => {
                Status::invalid_argument(msg)
            }
            ImageError::NotFound(_) => Status::not_found(msg),
            ImageError::Unavailable { .. } => Status::unavailable(msg),
            ImageError::AuthFailed { .. } => Status::unauthenticated(msg),
            ImageError::Unsupported(_) | ImageError::Hostile { .. } => {
                Status::failed_precondition(msg)
            }
            ImageError::Corrupt(_) => Status::data_loss(msg),
            ImageError::Stalled(_) => Status::deadline_exceeded(msg),
            ImageError::Internal(_) => Status::internal(msg),
        }
    }
}
