//! Writing a slot, and reading one back.

use super::*;

/// The slot bytes of slot `i`.
fn slot_range(cap: usize, i: usize) -> std::ops::Range<usize> {
    HEADER + i * cap..HEADER + (i + 1) * cap
}

/// The newest valid slot (by sequence number), trusting descriptors.
fn newest(d: &[Option<Desc>; 2]) -> Option<(usize, Desc)> {
    match (d[0], d[1]) {
        (Some(a), Some(b)) => Some(if a.seq >= b.seq { (0, a) } else { (1, b) }),
        (Some(a), None) => Some((0, a)),
        (None, Some(b)) => Some((1, b)),
        (None, None) => None,
    }
}

/// Copies the base of every region that is not whole out of `src` (a
/// slot's bytes holding version `base`), so the slot can be rewritten.
fn base_regions(src: &[u8], table_len: usize, snap: &Snapshot) -> Result<Vec<Option<Vec<u8>>>> {
    let places = layout(&src[..table_len])
        .ok_or_else(|| AppError::Internal("pmem slot table unreadable".into()))?;
    snap.regions
        .iter()
        .map(|r| {
            if r.whole {
                return Ok(None);
            }
            let p = places
                .iter()
                .find(|p| p.id == r.id && p.len as u64 == r.len)
                .ok_or_else(|| {
                    AppError::Internal(format!("region {} not in the base version", r.id))
                })?;
            Ok(Some(src[p.off..p.off + p.len].to_vec()))
        })
        .collect()
}

/// Writes table, bases and chunks into `slot`; returns the changed ranges.
fn fill(
    slot: &mut [u8],
    table: &[u8],
    places: &[Place],
    snap: &Snapshot,
    bases: &[Option<Vec<u8>>],
) -> Vec<(usize, usize)> {
    slot[..table.len()].copy_from_slice(table);
    let mut changed = vec![(0, table.len())];
    let mut at = 0usize;
    for ((r, p), base) in snap.regions.iter().zip(places).zip(bases) {
        if let Some(b) = base {
            slot[p.off..p.off + p.len].copy_from_slice(b);
        }
        for &(off, len) in &r.chunks {
            let (off, len) = (
                usize::try_from(off).unwrap_or(0),
                usize::try_from(len).unwrap_or(0),
            );
            slot[p.off + off..p.off + off + len].copy_from_slice(&snap.data[at..at + len]);
            changed.push((p.off + off, len));
            at += len;
        }
    }
    changed
}

/// The slot ranges the chunks of `snap` land on, in order.
fn chunk_ranges(places: &[Place], snap: &Snapshot) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (r, p) in snap.regions.iter().zip(places) {
        for &(off, len) in &r.chunks {
            let (off, len) = (
                usize::try_from(off).unwrap_or(0),
                usize::try_from(len).unwrap_or(0),
            );
            out.push((p.off + off, len));
        }
    }
    out
}

/// The parts of `ranges` (offset, length) that `cover` does not cover:
/// what the new chunks overwrite anyway need not be brought up to date.
fn uncovered(ranges: &[(usize, usize)], cover: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut cover: Vec<(usize, usize)> = cover.iter().map(|&(o, l)| (o, o + l)).collect();
    cover.sort_unstable();
    let mut out = Vec::new();
    for &(o, l) in ranges {
        let (mut a, b) = (o, o + l);
        // The first cover range that ends after `a`.
        let mut i = cover.partition_point(|&(_, e)| e <= a);
        while a < b {
            match cover.get(i) {
                Some(&(cs, ce)) if cs < b => {
                    if cs > a {
                        out.push((a, cs - a));
                    }
                    a = a.max(ce);
                    i += 1;
                }
                _ => {
                    out.push((a, b - a));
                    break;
                }
            }
        }
    }
    out
}

fn publish(map: &mut PmemMap, i: usize, d: &Desc, latency: u64) {
    map.bytes_mut()[DESC[i]..DESC[i] + 64].copy_from_slice(&d.encode());
    PmemTarget::persist(latency, map, DESC[i], 64);
}

impl PmemTarget {
    /// A checkpoint that does not fit: a new file, renamed over the old.
    fn commit_new_file(
        &mut self,
        name: &str,
        meta: &Meta,
        snap: &Snapshot,
        table: &[u8],
        places: &[Place],
        need: usize,
    ) -> Result<u64> {
        let path = self.path(name);
        let bases = match self.pool(name)?.map(|p| (descs(&p.map), p)) {
            Some((d, p)) => match newest(&d) {
                Some((i, nd)) if nd.id == meta.parent_id => {
                    let s = &p.map.bytes()[slot_range(p.cap, i)];
                    base_regions(s, nd.table_len as usize, snap)?
                }
                _ => vec![None; snap.regions.len()],
            },
            None => vec![None; snap.regions.len()],
        };
        if snap
            .regions
            .iter()
            .zip(&bases)
            .any(|(r, b)| !r.whole && b.is_none())
        {
            return Err(AppError::Internal(
                "pmem: a delta without its base version".into(),
            ));
        }
        let cap = (need + need / 4).next_multiple_of(4096).max(4096);
        let tmp = self
            .dir
            .join(format!(".{name}.pmem.tmp.{}", std::process::id()));
        let mut pool = Self::map_file(&tmp, Some(HEADER + 2 * cap))?
            .ok_or_else(|| AppError::Internal("new pmem file vanished".into()))?;
        let changed = fill(
            &mut pool.map.bytes_mut()[slot_range(cap, 0)],
            table,
            places,
            snap,
            &bases,
        );
        Self::persist(self.latency_ns, &pool.map, HEADER, need);
        let d = Desc {
            valid: true,
            seq: 1,
            id: meta.id,
            version: meta.version,
            table_len: u32::try_from(table.len()).unwrap_or(u32::MAX),
            data_len: need as u64,
            data_sum: xxh3_64(&pool.map.bytes()[HEADER..HEADER + need]),
        };
        publish(&mut pool.map, 0, &d, self.latency_ns);
        super::super::test_hold(self.commits);
        fs::rename(&tmp, &path).map_err(AppError::io("rename into place", &path))?;
        pool.prev = Some((meta.id, 0, changed));
        self.pools.retain(|(n, _)| n != name);
        self.pools.push((name.to_string(), pool));
        Ok((HEADER + need) as u64)
    }
}

impl Target for PmemTarget {
    fn takes_deltas(&self) -> bool {
        true
    }

    fn commit(&mut self, name: &str, meta: &Meta, snap: &Snapshot) -> Result<u64> {
        self.commits += 1;
        let regions: Vec<(i32, u64)> = snap.regions.iter().map(|r| (r.id, r.len)).collect();
        let table = encode_table(&regions);
        let places = layout(&table).ok_or_else(|| AppError::Internal("pmem table".into()))?;
        let need = table.len() + places.iter().map(|p| p.len).sum::<usize>();
        let latency = self.latency_ns;
        let commits = self.commits;
        let fits = matches!(self.pool(name)?, Some(p) if p.cap >= need);
        let Some(pool) = self.pool(name)?.filter(|_| fits) else {
            return self.commit_new_file(name, meta, snap, &table, &places, need);
        };
        let d = descs(&pool.map);
        let base = newest(&d);
        let s = base.map_or(0, |(i, _)| 1 - i);
        let old_s = d[s];
        let cap = pool.cap;
        // 1. The slot we overwrite stops being a version.
        publish(&mut pool.map, s, &Desc::default(), latency);
        // 2. Bring it to the base version, then 3. the new chunks.
        let all_whole = snap.regions.iter().all(|r| r.whole);
        let mut changed = Vec::new();
        match base {
            _ if all_whole => {}
            Some((bi, bd)) if bd.id == meta.parent_id => {
                let same_table = pool.map.bytes()[slot_range(cap, bi)][..table.len()] == table[..];
                match &pool.prev {
                    // Slot s holds the parent of the base: copy what the base changed.
                    Some((pid, on, ranges))
                        if *pid == bd.id && old_s.is_some_and(|o| o.id == *on) && same_table =>
                    {
                        let (src0, dst0) = (slot_range(cap, bi).start, slot_range(cap, s).start);
                        for (o, l) in uncovered(ranges, &chunk_ranges(&places, snap)) {
                            pool.map
                                .bytes_mut()
                                .copy_within(src0 + o..src0 + o + l, dst0 + o);
                            changed.push((o, l));
                        }
                    }
                    _ => {
                        let src = &pool.map.bytes()[slot_range(cap, bi)];
                        let bases = base_regions(src, bd.table_len as usize, snap)?;
                        let slot = &mut pool.map.bytes_mut()[slot_range(cap, s)];
                        fill(
                            slot,
                            &table,
                            &places,
                            &Snapshot {
                                regions: snap
                                    .regions
                                    .iter()
                                    .map(|r| RegionData {
                                        chunks: vec![],
                                        ..r.clone()
                                    })
                                    .collect(),
                                data: vec![],
                            },
                            &bases,
                        );
                        changed.push((0, need));
                    }
                }
            }
            _ => {
                return Err(AppError::Internal(
                    "pmem: a delta on a version not in the pool".into(),
                ))
            }
        }
        let none = vec![None; snap.regions.len()];
        let written = fill(
            &mut pool.map.bytes_mut()[slot_range(cap, s)],
            &table,
            &places,
            snap,
            &none,
        );
        let s0 = slot_range(cap, s).start;
        for &(o, l) in changed.iter().chain(&written) {
            Self::persist(latency, &pool.map, s0 + o, l);
        }
        // 4. Publish.
        let nd = Desc {
            valid: true,
            seq: base.map_or(1, |(_, b)| b.seq + 1),
            id: meta.id,
            version: meta.version,
            table_len: u32::try_from(table.len()).unwrap_or(u32::MAX),
            data_len: need as u64,
            data_sum: xxh3_64(&pool.map.bytes()[s0..s0 + need]),
        };
        super::super::test_hold(commits);
        publish(&mut pool.map, s, &nd, latency);
        let bytes = written
            .iter()
            .chain(&changed)
            .map(|&(_, l)| l as u64)
            .sum::<u64>()
            + 64;
        pool.prev = Some((meta.id, base.map_or(0, |(_, b)| b.id), written));
        Ok(bytes)
    }

    fn latest(&self, name: &str) -> Result<Option<i32>> {
        let Some(p) = Self::map_file(&self.path(name), None)? else {
            return Ok(None);
        };
        let mut ok: Vec<Desc> = descs(&p.map)
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.filter(|d| slot_ok(&p.map, p.cap, i, d)))
            .collect();
        ok.sort_by_key(|d| std::cmp::Reverse(d.seq));
        Ok(ok.first().map(|d| d.version))
    }

    fn load(&self, name: &str, version: i32) -> Result<(Meta, Vec<Snapshot>)> {
        let path = self.path(name);
        let nf = || AppError::NotFound {
            name: name.to_string(),
            version,
        };
        let p = Self::map_file(&path, None)?.ok_or_else(nf)?;
        let d = descs(&p.map);
        let mut cands: Vec<(usize, Desc)> = d
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.filter(|d| d.version == version).map(|d| (i, d)))
            .collect();
        cands.sort_by_key(|(_, d)| std::cmp::Reverse(d.seq));
        let (i, d) = *cands.first().ok_or_else(nf)?;
        if !slot_ok(&p.map, p.cap, i, &d) {
            return Err(AppError::damaged(
                &path,
                format!("slot {i} (version {version}) fails its checksum"),
            ));
        }
        let slot = &p.map.bytes()[slot_range(p.cap, i)];
        let places = layout(&slot[..d.table_len as usize])
            .ok_or_else(|| AppError::damaged(&path, "bad region table"))?;
        let mut snap = Snapshot::default();
        for pl in &places {
            snap.regions.push(RegionData {
                id: pl.id,
                len: pl.len as u64,
                whole: true,
                chunks: vec![(0, pl.len as u64)],
            });
            snap.data.extend_from_slice(&slot[pl.off..pl.off + pl.len]);
        }
        let meta = Meta {
            depth: 0,
            id: d.id,
            parent_id: 0,
            version,
            parent_version: -1,
        };
        Ok((meta, vec![snap]))
    }
}

#[cfg(test)]
mod tests {
    use super::uncovered;

    #[test]
    fn catch_up_skips_what_the_new_chunks_overwrite() {
        // Ranges [0,100) [200,300) [400,410); chunks cover [50,250) and [400,410).
        let got = uncovered(&[(0, 100), (200, 100), (400, 10)], &[(400, 10), (50, 200)]);
        assert_eq!(got, [(0, 50), (250, 50)]);
        assert_eq!(uncovered(&[(10, 5)], &[]), [(10, 5)]);
        assert_eq!(
            uncovered(&[(10, 20)], &[(12, 2), (20, 3)]),
            [(10, 2), (14, 6), (23, 7)]
        );
    }
}
