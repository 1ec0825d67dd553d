"""The fixed English word list of the simulated tokenizer's vocabulary (and of generated text).

Frozen: token ids are assigned from this list in order, so editing it changes every id the
simulator emits. Append-only if it must ever grow.
"""

from __future__ import annotations

# Whitespace-separated on purpose: a compact data table, split once at import.
_COMMON = """
the of and to in is was that for it as with be on not he by are this at from his but have an
they which or one you had her all she there were their been has will more if no when would who
so said what up its about into than them can only other time new some could these two may first
then do any like my now over such our man me even most made after also did many before must
through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being
under never day same another know while last might us great old year off come since against go
came right used take three states himself few house use during without again place around
however home small found thought went say part once general high upon school every does got
united left number course war until always away something fact though water less public put
think almost hand enough far took head yet government system better set told nothing night end
why called didn find look going asked later knew point next program city business give group
toward young days let room president side social given present several order national possible
rather second face per among form important often things looked early white case john become
large big need four within felt along children saw best church ever least power development
light thing seemed family interest want members mind country area others done turned although
open god service certain kind problem began different door thus help sense means whole matter
perhaps itself york times law human line above name example action company hands local show
whether five history gave today either act feet across taken past quite anything seen having
death week experience body word half really field am car words already themselves information
tell together college shall money period held keep sure real probably free seems political
cannot behind miss question air office making brought whose special major heard problems ago
became federal moment study available known result street economic boy position reason change
south board individual job society areas west close turn love community true court force full
seem wife future age voice center woman control common policy necessary following front
sometimes six girl clear further land run students provide feel party able mother music
education university child effect level stood military town short morning total outside rate
figure class art century north washington leave therefore top evidence sound played usually
black strong hard various believe type value play surface soon mean near lines table peace
modern tax road red book personal process situation minutes increase schools idea english alone
women gone nor amount doing age pressure private mr wanted ideas someone himself data model
cache request token tokens prompt system user assistant answer question document report summary
context memory server engine router block blocks prefix hash event events latency throughput
queue batch response reply please thanks hello help explain describe compare list write code
function class file test tests error errors value values result results input output simple
quick short long fast slow
"""

# Words the response generator draws from: frequent, short, and all in COMMON_WORDS.
_GENERATION = """
the of and to in is that for it as with on this at from by are be an which or one all there
their has will more when would who what about into than can other time new some could these two
first then like now over such even most made after also many before through back where much way
well down should each just those people how little state good very make world still work long
here between both life under never day same another know while last might great year come since
place around home small found thought part high upon every does number course water less public
think hand enough far head system better set point next program city business group model cache
request token prompt user answer question document report summary context memory server engine
router block prefix event latency throughput queue batch response value result input output
"""

COMMON_WORDS: tuple[str, ...] = tuple(_COMMON.split())
GENERATION_WORDS: tuple[str, ...] = tuple(_GENERATION.split())
