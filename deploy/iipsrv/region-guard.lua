-- lighttpd mod_magnet (Lua) guard in front of iipsrv 1.1: crops an IIIF region that extends beyond an image's
-- right or bottom edge to the image, as the Image API asks, before iipsrv sees it.
--
-- Why: iipsrv 1.1 picks the pyramid level from the region as asked, not as cropped. `W-1,H-1,10,10/full` (W,H the
-- image's size) asks for the cropped 1x1 pixels "at full size", which iipsrv reads as a 10x downscale: it picks a
-- level 4 or 8 times smaller, where the region's left (top) rounds to the level's width (height) and the region is
-- 0x0. On a TIFF, TileManager::getRegion then crashes the process (SIGSEGV); on a JP2, OpenJPEG fails after iipsrv
-- has sent its 200 and image/jpeg headers, so the error text goes out as a JPEG to be cached for a day (and a JP2
-- needs overhang on one axis only: iipsrv does not crop a region's height). The guard reads the image's size
-- from the file (a TIFF's first directory, a JP2's ihdr box: a few hundred bytes, per request) and rewrites the
-- region to the cropped one; a region wholly outside the image is a 400, as the Image API says.
--
-- It also gives iipsrv a size that leaves one side to it (`w,`, `,h`, `pct:n`) or a best fit (`!w,h`) as the exact
-- `w,h` the Image API defines: iipsrv 1.1 seems to derive both sides from the aspect ratio of a pyramid level's
-- rounded size (`full/469,` on a 6000x1000 image is 468x78, `full/8,` is 6x1), while a `w,h` size it renders as
-- asked. The side left to the server keeps the aspect ratio of the region as cropped, rounded to the nearest pixel
-- (the Image API leaves the rounding open; a half rounds up); a side under one pixel is a 400 (a viewer's last tile
-- row at a reduced resolution: rounded up, iipsrv crashes on a TIFF or sends OpenJPEG's error as a JPEG), or 1 on a
-- TIFF region spanning the image on that side (a 5000x1 strip); a size over MAX_CVT is left to iipsrv, which caps
-- it. Only requests with such a size or a region other than `full` and `square` read the file.
--
-- The request is read as iipsrv reads it (percent-decoded, split from its end), so an encoded `/` or `,` does not
-- get past; a malformed region, or a `w,`, `,h` or `pct:n` size that is not plain decimals, is a 400, and
-- /iipsrv.fcgi is a 404 unless reached through the IIIF prefix.
--
-- Being the one script lighttpd runs before iipsrv, it also answers CORS preflights (OPTIONS), on every URL.

local prefix = os.getenv("GCIS_IIIF_PREFIX")  -- read per request: mod_magnet runs the script afresh
local images = os.getenv("FILESYSTEM_PREFIX")
local max_cvt = tonumber(os.getenv("MAX_CVT") or "") or 5000  -- iipsrv's default

local function decode(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function encode(s)  -- so that iipsrv's own decoding gives back s
  return (s:gsub("[^%w%-%._~/,:!]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- Width and height from the first directory of a classic or BigTIFF file; nil if it is not one.
local function tiff_size(f, head)
  local order = ({II = "<", MM = ">"})[head:sub(1, 2)]
  if not order then return nil end
  local magic = string.unpack(order .. "I2", head, 3)
  local count_fmt, entry_len, value_at, offset
  if magic == 42 then
    offset, count_fmt, entry_len, value_at = string.unpack(order .. "I4", head, 5), "I2", 12, 9
  elseif magic == 43 then
    offset, count_fmt, entry_len, value_at = string.unpack(order .. "I8", head, 9), "I8", 20, 13
  else
    return nil
  end
  f:seek("set", offset)
  local raw = f:read(string.packsize(count_fmt))
  local n = raw and #raw == string.packsize(count_fmt) and string.unpack(order .. count_fmt, raw)
  local entries = n and n < 4096 and f:read(n * entry_len)
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

-- Width and height from a JP2's header box (jp2h), whose first box is the image header (ihdr: height, width, ...);
-- nil if it is not one. The boxes before jp2h (signature, file type, maybe others) are skipped by their lengths.
local function jp2_size(f, head)
  if head:sub(1, 12) ~= "\0\0\0\12jP  \r\n\x87\n" then return nil end
  local at = 12
  for _ = 1, 16 do
    f:seek("set", at)
    local box = f:read(24)
    if not box or #box < 8 then return nil end
    local length, kind = string.unpack(">I4c4", box)
    if kind == "jp2h" then
      if #box < 24 or box:sub(13, 16) ~= "ihdr" then return nil end
      local height, width = string.unpack(">I4I4", box, 17)
      return width, height
    end
    if length == 1 and #box >= 16 then length = string.unpack(">I8", box, 9) end
    if length < 8 then return nil end  -- 0: the last box, running to the end of the file
    at = at + length
  end
  return nil
end

-- Width and height of the TIFF or JP2 at `path`; nil if it is neither (iipsrv's own 404 or error stands).
local function image_size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local head = f:read(16)
  local width, height
  if head and #head == 16 then
    width, height = tiff_size(f, head)
    if not width then width, height = jp2_size(f, head) end
  end
  f:close()
  return width, height
end

local function number(s)  -- a plain decimal, in a region or `pct:n` (iipsrv's atof would also take hex, inf, "10abc")
  if s:match("^%d+$") or s:match("^%d*%.%d+$") or s:match("^%d+%.$") then return tonumber(s) end
  return nil
end

-- The region cropped to a width x height image, as pixels (from the pixel its start lies in to the one its end lies
-- in, so that it covers what was asked), and its width and height in pixels; `false` when it is wholly outside, nil
-- when malformed. Unchanged (the same string) when it lies within the image.
local function cropped(region, width, height)
  if region == "full" then return region, width, height end
  if region == "square" then return region, math.min(width, height), math.min(width, height) end
  local pct = region:sub(1, 4) == "pct:"
  local v, n = {}, 0
  for token in ((pct and region:sub(5) or region) .. ","):gmatch("([^,]*),") do
    n = n + 1
    v[n] = number(token)
    if not v[n] then return nil end
  end
  if n ~= 4 or v[3] <= 0 or v[4] <= 0 then return nil end
  if pct then
    if v[1] + v[3] <= 100 and v[2] + v[4] <= 100 then return region, v[3] * width / 100, v[4] * height / 100 end
    v = {v[1] * width / 100, v[2] * height / 100, v[3] * width / 100, v[4] * height / 100}
  elseif v[1] + v[3] <= width and v[2] + v[4] <= height then
    return region, v[3], v[4]
  end
  if v[1] >= width or v[2] >= height then return false end
  local x, y = math.floor(v[1]), math.floor(v[2])
  local w, h = math.min(math.ceil(v[1] + v[3]), width) - x, math.min(math.ceil(v[2] + v[4]), height) - y
  return string.format("%d,%d,%d,%d", x, y, w, h), w, h
end

-- A size the guard computes: `w,`, `,h`, `pct:n` (what iipsrv would read as one, `^` and `!` prefixes and `,`
-- alone included, though it refuses some of them) or `!w,h`.
local function computed(size)
  return size:sub(-1) == "," or size:sub(1, 1) == "," or size:sub(1, 4) == "pct:" or size:sub(1, 1) == "!"
end

-- A computed size as the exact `w,h` for a region of width x height pixels; nil when malformed or a side is 0,
-- unchanged when it is over MAX_CVT (iipsrv caps it). `!w,h` is the largest size within w,h: the side that binds
-- is as asked, the other computed as for `w,` or `,h`. A computed side under one pixel is 0 (iipsrv renders a
-- row or column at the image's edge from a level where it is empty), unless `whole_width` (`whole_height`): the
-- region spans the image's width (height) in a TIFF, where it starts at 0 on every level, and is one pixel.
local function exact(size, width, height, whole_width, whole_height)
  local function side(x, whole)
    if x >= 1 then return math.floor(x + 0.5) end
    return whole and 1 or nil
  end
  local one_side = size
  local fit_width, fit_height = size:match("^!(%d+),(%d+)$")
  if fit_width then
    local binds = tonumber(fit_width) * height <= tonumber(fit_height) * width
    one_side = binds and fit_width .. "," or "," .. fit_height
  end
  local w, h
  if one_side:match("^%d+,$") then
    w = tonumber(one_side:sub(1, -2))
    h = w * height / width
  elseif one_side:match("^,%d+$") then
    h = tonumber(one_side:sub(2))
    w = h * width / height
  else
    local n = one_side:sub(1, 4) == "pct:" and number(one_side:sub(5))
    if not n then return nil end
    w, h = width * n / 100, height * n / 100
  end
  if w == 0 or h == 0 then return nil end  -- asked for
  w, h = side(w, whole_width), side(h, whole_height)
  if not w or not h then return nil end
  if w > max_cvt or h > max_cvt then return size end
  return string.format("%d,%d", w, h)
end

-- An error of the guard's own, as text (its Access-Control-Allow-Origin is lighttpd.conf's: mod_setenv, loaded
-- before mod_magnet, sets it on what this script answers too).
local function refused(status, reason)
  lighty.r.resp_header["Content-Type"] = "text/plain"
  lighty.r.resp_body:set({reason, "\n"})
  return status
end

-- A CORS preflight, answered here for every URL: iipsrv would answer OPTIONS as a GET, and lighttpd answers it
-- for existing files only, without the headers a client sending more than a simple request needs (the Accept
-- with a profile that the IIIF specifications recommend, Range, the conditional headers of a revalidation).
-- Everything lighttpd serves is read-only: GET and HEAD.
local function preflight()
  lighty.r.resp_header["Access-Control-Allow-Methods"] = "GET, HEAD, OPTIONS"
  lighty.r.resp_header["Access-Control-Allow-Headers"] = "Accept, Accept-Language, Content-Language, Range, "
                                                         .. "If-None-Match, If-Modified-Since, Cache-Control"
  lighty.r.resp_header["Access-Control-Max-Age"] = "86400"
  return 204
end

if lighty.r.req_attr["request.method"] == "OPTIONS" then return preflight() end
-- mod_rewrite has already run: the request is what iipsrv is given, /iipsrv.fcgi?IIIF=<as sent below the prefix>
local target = lighty.r.req_attr["request.uri"]
if target:sub(1, 13) ~= "/iipsrv.fcgi?" then return 0 end
local sent = lighty.r.req_attr["request.orig-uri"]
if sent:sub(1, #prefix + 1) ~= prefix .. "/" then return refused(404, "not found") end  -- iipsrv only through the IIIF prefix
local query = lighty.r.req_attr["uri.query"]  -- what iipsrv gets as QUERY_STRING (the rewrite encoded any '&')
if query:sub(1, 5) ~= "IIIF=" then return refused(400, "malformed request") end
local argument = decode(query:sub(6))
if argument:match("/info[^/]*$") then return 0 end  -- iipsrv: a last segment starting with "info" asks for info.json
-- as iipsrv splits it: the last segment is the format, the three before it are region, size and rotation
local identifier, region, size, rest = argument:match("^(.+)/([^/]*)/([^/]*)(/[^/]*/[^/]*)$")
local suffix = identifier and identifier:lower():match("%.(%w+)$")
if suffix ~= "tif" and suffix ~= "tiff" and suffix ~= "jp2" then return 0 end
if ("/" .. identifier .. "/"):find("/../", 1, true) then return refused(400, "malformed identifier") end
region, size = region:lower(), size:lower()  -- as iipsrv reads them
if (region == "full" or region == "square") and not computed(size) then return 0 end  -- nothing to compute
local width, height = image_size(images .. identifier)
if not width then return 0 end
local region_as_cropped, region_width, region_height = cropped(region, width, height)
if not region_as_cropped then return refused(400, "malformed region, or outside the image") end
local size_as_sent = size
if computed(size) then
  local tiff = suffix ~= "jp2"
  size_as_sent = exact(size, region_width, region_height, tiff and region_width == width,
                       tiff and region_height == height)
  if not size_as_sent then return refused(400, "malformed size, or a side of 0 pixels") end
end
if region_as_cropped ~= region or size_as_sent ~= size then
  lighty.r.req_attr["uri.query"] = "IIIF=" .. encode(identifier .. "/" .. region_as_cropped .. "/" .. size_as_sent
                                                      .. rest)
end
return 0
