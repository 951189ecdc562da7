-- lighttpd mod_magnet (Lua) guard in front of iipsrv 1.1: crops an IIIF region that extends beyond a TIFF's
-- right or bottom edge to the image, as the Image API asks, before iipsrv sees it.
--
-- Why: iipsrv 1.1 picks the pyramid level from the region as asked, not as cropped. `W-1,H-1,10,10/full` (W,H the
-- image's size) asks for the cropped 1x1 pixels "at full size", which iipsrv reads as a 10x downscale: it picks a
-- level 4 or 8 times smaller, where the region's left (top) rounds to the level's width (height), the region is
-- 0x0 and TileManager::getRegion crashes the process (SIGSEGV). The guard reads the image's size from the
-- TIFF's first directory (a few hundred bytes, per request; JP2s are not affected and left alone) and rewrites
-- the region to the cropped one; a region wholly outside the image is a 400, as the Image API says.
--
-- The request is read as iipsrv reads it (percent-decoded, split from its end), so an encoded `/` or `,` does not
-- get past; a malformed region is a 400, and /iipsrv.fcgi is a 404 unless reached through the IIIF prefix.

local prefix = os.getenv("GCIS_IIIF_PREFIX")  -- read per request: mod_magnet runs the script afresh
local images = os.getenv("FILESYSTEM_PREFIX")

local function decode(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function encode(s)  -- so that iipsrv's own decoding gives back s
  return (s:gsub("[^%w%-%._~/,:!]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- Width and height from the first directory of a classic or BigTIFF file; nil if it is not one.
local function tiff_size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local head = f:read(16)
  if not head or #head < 16 then f:close(); return nil end
  local order = ({II = "<", MM = ">"})[head:sub(1, 2)]
  if not order then f:close(); return nil end
  local magic = string.unpack(order .. "I2", head, 3)
  local count_fmt, entry_len, value_at, offset
  if magic == 42 then
    offset, count_fmt, entry_len, value_at = string.unpack(order .. "I4", head, 5), "I2", 12, 9
  elseif magic == 43 then
    offset, count_fmt, entry_len, value_at = string.unpack(order .. "I8", head, 9), "I8", 20, 13
  else
    f:close(); return nil
  end
  f:seek("set", offset)
  local raw = f:read(string.packsize(count_fmt))
  local n = raw and #raw == string.packsize(count_fmt) and string.unpack(order .. count_fmt, raw)
  local entries = n and n < 4096 and f:read(n * entry_len)
  f:close()
  if not entries or #entries < n * entry_len then return nil end
  local size = {}
  for i = 0, n - 1 do
    local at = i * entry_len + 1
    local tag, kind = string.unpack(order .. "I2I2", entries, at)
    if tag == 256 or tag == 257 then
      size[tag] = string.unpack(order .. (kind == 3 and "I2" or "I4"), entries, at + value_at - 1)
    end
  end
  if size[256] and size[257] then return size[256], size[257] end
  return nil
end

local function number(s)  -- a plain decimal: what a region holds (iipsrv's atof would also take hex, inf, "10abc")
  if s:match("^%d+$") or s:match("^%d*%.%d+$") or s:match("^%d+%.$") then return tonumber(s) end
  return nil
end

-- The region cropped to a width x height image, as pixels; `false` when it is wholly outside, nil when
-- malformed. Unchanged (the same string) when it lies within the image.
local function cropped(region, width, height)
  local pct = region:sub(1, 4) == "pct:"
  local v, n = {}, 0
  for token in ((pct and region:sub(5) or region) .. ","):gmatch("([^,]*),") do
    n = n + 1
    v[n] = number(token)
    if not v[n] then return nil end
  end
  if n ~= 4 or v[3] <= 0 or v[4] <= 0 then return nil end
  if pct then
    if v[1] + v[3] <= 100 and v[2] + v[4] <= 100 then return region end
    v = {v[1] * width / 100, v[2] * height / 100, v[3] * width / 100, v[4] * height / 100}
    for i = 1, 4 do v[i] = math.floor(v[i] + 0.5) end
  elseif v[1] + v[3] <= width and v[2] + v[4] <= height then
    return region
  end
  if v[1] >= width or v[2] >= height then return false end
  return string.format("%d,%d,%d,%d", math.floor(v[1]), math.floor(v[2]),
                       math.max(1, math.floor(math.min(v[3], width - v[1]))),
                       math.max(1, math.floor(math.min(v[4], height - v[2]))))
end

-- mod_rewrite has already run: the request is what iipsrv is given, /iipsrv.fcgi?IIIF=<as sent below the prefix>
local target = lighty.r.req_attr["request.uri"]
if target:sub(1, 13) ~= "/iipsrv.fcgi?" then return 0 end
local sent = lighty.r.req_attr["request.orig-uri"]
if sent:sub(1, #prefix + 1) ~= prefix .. "/" then return 404 end  -- iipsrv only through the IIIF prefix
local query = lighty.r.req_attr["uri.query"]  -- what iipsrv gets as QUERY_STRING (the rewrite encoded any '&')
if query:sub(1, 5) ~= "IIIF=" then return 400 end
local argument = decode(query:sub(6))
if argument:match("/info[^/]*$") then return 0 end  -- iipsrv: a last segment starting with "info" asks for info.json
-- as iipsrv splits it: the last segment is the format, the three before it are region, size and rotation
local identifier, region, rest = argument:match("^(.+)/([^/]*)(/[^/]*/[^/]*/[^/]*)$")
if not identifier or not identifier:lower():match("%.tiff?$") then return 0 end
if ("/" .. identifier .. "/"):find("/../", 1, true) then return 400 end
if region:lower() == "full" or region:lower() == "square" then return 0 end  -- no size needed: no file read
local width, height = tiff_size(images .. identifier)
if not width then return 0 end  -- not a TIFF iipsrv can read: its 404 or error stands
local region_as_cropped = cropped(region:lower(), width, height)
if not region_as_cropped then return 400 end
if region_as_cropped ~= region:lower() then
  lighty.r.req_attr["uri.query"] = "IIIF=" .. encode(identifier .. "/" .. region_as_cropped .. rest)
end
return 0
