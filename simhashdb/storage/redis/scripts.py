"""The Lua scripts the Redis backend runs on the servers: MERGE and HWRITE
(fenced writes of a batch's buckets and hashes), SCAN (the ranges of a
query, in the tables or the bands), PREFIX (the fingerprints of the index
that start with given bits), and ACQUIRE, RENEW, BEGIN, FINISH, RELEASE (the
write lock and the epoch of the batch protocol, :mod:`.protocol`)."""

# Entries are compared as two numbers (Lua's are doubles): the first W - 4
# bytes and the last 4.
_LUA_COMMON = """
local W = tonumber(ARGV[1])
local KL = tonumber(ARGV[2])
local blob = ARGV[3]
local fmt = '>I' .. (W - 4) .. 'I4'
local function lower_bound(s, n, a, b, i)
  local j = n
  while i < j do
    local m = math.floor((i + j) / 2)
    local x, y = struct.unpack(fmt, s, m * W + 1)
    if x < a or (x == a and y < b) then i = m + 1 else j = m end
  end
  return i
end
"""

# ARGV[first..]: fence keys, each the epoch of the last batch that wrote in
# its slot. A write of an older batch (its writer stalled past its lease
# while a later batch was written) is refused; the others raise them.
_LUA_FENCE = """
local function fenced(epoch, first)
  for i = first, #ARGV do
    if tonumber(redis.call('GET', ARGV[i]) or '0') > epoch then return true end
  end
  for i = first, #ARGV do redis.call('SET', ARGV[i], epoch) end
  return false
end
"""
FENCED = "FENCED a later batch wrote here"

# ARGV[3]: records of key, 4-byte add count, 4-byte delete count, the adds
# and the deletes (entries of W bytes, each list sorted); ARGV[4]: the batch's
# epoch; ARGV[5..]: the fence keys of the records' slots. Each bucket becomes
# (bucket | adds) - deletes; an emptied bucket is deleted.
MERGE = "#!lua flags=allow-cross-slot-keys\n" + _LUA_COMMON + _LUA_FENCE + """
if fenced(tonumber(ARGV[4]), 5) then return redis.error_reply('%s') end
local pos = 1
while pos <= #blob do
  local key = string.sub(blob, pos, pos + KL - 1)
  local nadd, ndel = struct.unpack('>I4I4', blob, pos + KL)
  local adds = pos + KL + 8
  local dels = adds + nadd * W
  pos = dels + ndel * W
  -- adds without deletes into an empty bucket, or all after its last entry,
  -- are written at once, not entry by entry
  local fresh = ndel == 0 and redis.call('SET', key, string.sub(blob, adds, dels - 1), 'NX')
  local s = fresh and '' or redis.call('GET', key) or ''
  local n = #s / W
  local pieces, copied, at, i, j = {}, 0, 0, 0, 0
  if fresh then
    i = nadd
  elseif ndel == 0 and n > 0 then
    local x, y = struct.unpack(fmt, s, (n - 1) * W + 1)
    local a, b = struct.unpack(fmt, blob, adds)
    if x < a or (x == a and y < b) then
      pieces[1], pieces[2], copied, i = s, string.sub(blob, adds, dels - 1), n, nadd
    end
  end
  while i < nadd or j < ndel do
    local off, adding
    if j >= ndel then
      off, adding = adds + i * W, true
    elseif i >= nadd then
      off, adding = dels + j * W, false
    else
      local a1, b1 = struct.unpack(fmt, blob, adds + i * W)
      local a2, b2 = struct.unpack(fmt, blob, dels + j * W)
      adding = a1 < a2 or (a1 == a2 and b1 < b2)
      off = adding and adds + i * W or dels + j * W
    end
    if adding then i = i + 1 else j = j + 1 end
    local a, b = struct.unpack(fmt, blob, off)
    at = lower_bound(s, n, a, b, at)
    local found = false
    if at < n then
      local x, y = struct.unpack(fmt, s, at * W + 1)
      found = x == a and y == b
    end
    if adding and not found then
      pieces[#pieces + 1] = string.sub(s, copied * W + 1, at * W)
      pieces[#pieces + 1] = string.sub(blob, off, off + W - 1)
      copied = at
    elseif found and not adding then
      pieces[#pieces + 1] = string.sub(s, copied * W + 1, at * W)
      copied = at + 1
      at = at + 1
    end
  end
  if #pieces > 0 then
    pieces[#pieces + 1] = string.sub(s, copied * W + 1)
    local merged = table.concat(pieces)
    if #merged == 0 then redis.call('DEL', key) else redis.call('SET', key, merged) end
  end
end
return 1
""" % FENCED

# ARGV: hash key, the batch's epoch, how many fields to set, those fields and
# their values, the fields to delete, and last the fence key of the hash's slot.
HWRITE = "#!lua flags=allow-cross-slot-keys\n" + _LUA_FENCE + """
if fenced(tonumber(ARGV[2]), #ARGV) then return redis.error_reply('%s') end
local key, sets = ARGV[1], 4 + 2 * tonumber(ARGV[3])
for i = 4, sets - 1, 1000 do
  redis.call('HSET', key, unpack(ARGV, i, math.min(i + 999, sets - 1)))
end
for i = sets, #ARGV - 1, 1000 do
  redis.call('HDEL', key, unpack(ARGV, i, math.min(i + 999, #ARGV - 1)))
end
return 1
""" % FENCED

# ARGV[3]: ranges of key, first entry, last entry. Returns {range number,
# entries, ...} for the ranges that hold entries (numbered from 1): those of
# the range, or all of a bucket of at most WHOLE (the client checks each
# entry's distance anyway, and searching a small bucket costs more than
# sending it).
SCAN = "#!lua flags=allow-cross-slot-keys,no-writes\n" + _LUA_COMMON + """
local WHOLE = 32
local out, last, s, n = {}, nil, '', 0
local size = KL + 2 * W
for r = 0, #blob / size - 1 do
  local pos = r * size + 1
  local key = string.sub(blob, pos, pos + KL - 1)
  if key ~= last then
    s, last = redis.call('GET', key) or '', key
    n = #s / W
  end
  if n > 0 and n <= WHOLE then
    out[#out + 1] = r + 1
    out[#out + 1] = s
  elseif n > 0 then
    local a, b = struct.unpack(fmt, blob, pos + KL)
    local i = lower_bound(s, n, a, b, 0)
    local ha, hb = struct.unpack(fmt, blob, pos + KL + W)
    local j = i
    while j < n do
      local x, y = struct.unpack(fmt, s, j * W + 1)
      if x > ha or (x == ha and y > hb) then break end
      j = j + 1
    end
    if j > i then
      out[#out + 1] = r + 1
      out[#out + 1] = string.sub(s, i * W + 1, j * W)
    end
  end
end
return out
"""

# ARGV: pairs of a fingerprint index hash's key and the 4-byte prefixes wanted
# there, one after another. Returns {field, value, ...} of the fields (8-byte
# fingerprints) that start with a wanted prefix. A hash holds few fields (its
# shard is the fingerprints' leading bits), so it is read whole.
PREFIX = "#!lua flags=allow-cross-slot-keys,no-writes\n" + """
local out = {}
for i = 1, #ARGV - 1, 2 do
  local wanted, p = {}, ARGV[i + 1]
  for j = 1, #p - 3, 4 do wanted[string.sub(p, j, j + 3)] = true end
  local fields = redis.call('HGETALL', ARGV[i])
  for k = 1, #fields - 1, 2 do
    if wanted[string.sub(fields[k], 1, 4)] then
      out[#out + 1] = fields[k]
      out[#out + 1] = fields[k + 1]
    end
  end
end
return out
"""

# KEYS: lock, pending, count, distinct, epoch, hold, queued, layout; ARGV: token,
# lease ms. The holder of the token may take the lock again (after a failover
# interrupted it). A writer that finds the lock taken queues for the next turn
# (one at a time, for a lease), so that a writer in a loop cannot keep it.
# While a reader holds new batches back, only a pending one is landed. With
# ARGV[3] (a reader recovering a dead writer's batch), nothing pending is {2}.
ACQUIRE = """
if ARGV[3] and not redis.call('GET', KEYS[2]) then return {2} end
local holder, queued = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[7])
if holder == ARGV[1] or (not holder and (not queued or queued == ARGV[1])) then
  if redis.call('EXISTS', KEYS[6]) == 1 and not redis.call('GET', KEYS[2]) then
    return {0, redis.call('PTTL', KEYS[6])}
  end
  if queued == ARGV[1] then redis.call('DEL', KEYS[7]) end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or '0',
          redis.call('GET', KEYS[4]) or '0', redis.call('GET', KEYS[5]) or '0',
          redis.call('GET', KEYS[8])}
end
if not queued then redis.call('SET', KEYS[7], ARGV[1], 'PX', ARGV[2]) end
return {0, redis.call('PTTL', KEYS[1])}
"""
# Whether the lock (KEYS[1]) is the token's (ARGV[1]), or lapsed with its
# epoch key still at ``epoch`` (no other writer wrote or finished a batch).
_LUA_HOLDS = """
local function holds(epoch_key, epoch)
  local holder = redis.call('GET', KEYS[1])
  return holder == ARGV[1] or (not holder and (redis.call('GET', epoch_key) or '0') == epoch)
end
"""
# KEYS: lock, epoch; ARGV: token, lease ms, the (odd) epoch of the batch
# being applied. A lock that expired meanwhile is taken back if no other
# writer finished the batch (the epoch did not move).
RENEW = _LUA_HOLDS + """
if holds(KEYS[2], ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# KEYS: lock, pending, epoch; ARGV: token, plan, lease ms, the epoch the
# batch was planned at. The epoch is odd while a plan is pending. A lock
# that expired while the batch was planned is taken back if no batch was
# written since (the epoch did not move).
BEGIN = _LUA_HOLDS + """
if not holds(KEYS[3], ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if not redis.call('GET', KEYS[2]) then redis.call('INCR', KEYS[3]) end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
# KEYS: lock, pending, epoch, count, distinct, params; ARGV: token, the (odd)
# epoch of the batch, its count and distinct, and its params if it sets them.
FINISH = _LUA_HOLDS + """
if not holds(KEYS[3], ARGV[2]) then return 0 end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[4], ARGV[3])
  redis.call('SET', KEYS[5], ARGV[4])
  if ARGV[5] then redis.call('SET', KEYS[6], ARGV[5]) end
end
return 1
"""
# KEYS: any of lock, queued, hold; ARGV: token. Deletes those the token holds.
RELEASE = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""
