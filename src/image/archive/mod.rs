//! Image archives for nodes without a registry: import of OCI image layouts and `docker save`
//! archives, and export as one archive that is both.

mod export;
mod import;
mod layout;
mod reading;
