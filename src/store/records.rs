//! Typed access to tables of JSON records keyed by id (sandboxes, and containers next).

use redb::{ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Store, StoreError};

impl Store {
    /// Writes (or replaces) the record `id` in `table`.
    pub fn put_record<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        id: &str,
        record: &T,
    ) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(record).map_err(|source| StoreError::Corrupt {
            key: id.to_string(),
            source,
        })?;
        let txn = self.db.begin_write()?;
        txn.open_table(table)?.insert(id, bytes.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// Reads the record `id`.
    pub fn get_record<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(table)?;
        match t.get(id)? {
            Some(v) => serde_json::from_slice(v.value())
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    key: id.to_string(),
                    source,
                }),
            None => Ok(None),
        }
    }

    /// Every record of `table`.
    pub fn list_records<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(table)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            out.push(
                serde_json::from_slice(v.value()).map_err(|source| StoreError::Corrupt {
                    key: k.value().to_string(),
                    source,
                })?,
            );
        }
        Ok(out)
    }

    /// Deletes the record `id`; absent is fine.
    pub fn delete_record(
        &self,
        table: TableDefinition<&str, &[u8]>,
        id: &str,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        txn.open_table(table)?.remove(id)?;
        txn.commit()?;
        Ok(())
    }

    /// The record whose id is `id`, or else the only one whose id starts with `id`.
    pub fn find_record<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        id: &str,
        id_of: impl Fn(&T) -> &str,
    ) -> Result<Option<T>, StoreError> {
        if let Some(rec) = self.get_record(table, id)? {
            return Ok(Some(rec));
        }
        let mut matches: Vec<T> = self
            .list_records(table)?
            .into_iter()
            .filter(|r| id_of(r).starts_with(id))
            .collect();
        Ok(if matches.len() == 1 {
            matches.pop()
        } else {
            None
        })
    }
}
